"""A closed loop on the offline engine, for the benchmarks here: C requests in flight, each replaced when it ends."""
from __future__ import annotations

import time

from tally import LLM, SamplingParams
from tally.outputs import RequestOutput


def closed_loop(llm: LLM, prompts: list[str], concurrency: int, params: SamplingParams | list[SamplingParams],
                finished: list[RequestOutput] | None = None,
                decode_calls: list[tuple[float, int]] | None = None) -> tuple[float, list[list[int]]]:
    """Tokens per second over the whole closed loop, and each prompt's tokens (each final output appended to
    `finished` when given: its metrics have the request's timings; each engine call without a prompt chunk to
    `decode_calls` as its seconds and tokens, the engine's own count)."""
    engine = llm.engine
    outputs: dict[str, list[int]] = {}
    pending = list(enumerate(prompts))
    started = time.perf_counter()
    in_flight = 0
    generated = 0
    while pending or in_flight:
        while pending and in_flight < concurrency:
            i, prompt = pending.pop(0)
            engine.add_request(str(i), prompt, params[i] if isinstance(params, list) else params)
            in_flight += 1
        stats = engine.stats
        seconds, tokens = stats.decode_step_seconds, stats.decode_step_tokens
        outs = engine.step()
        if decode_calls is not None and stats.decode_step_seconds > seconds:
            decode_calls.append((stats.decode_step_seconds - seconds, stats.decode_step_tokens - tokens))
        for out in outs:
            if out.finished:
                in_flight -= 1
                outputs[out.request_id] = out.outputs[0].token_ids
                if finished is not None:
                    finished.append(out)
                generated += len(out.outputs[0].token_ids)
    elapsed = time.perf_counter() - started
    return generated / elapsed, [outputs[str(i)] for i in range(len(prompts))]
