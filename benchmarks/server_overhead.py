"""What HTTP costs: throughput and TTFT through `tally serve` (streaming /v1/completions) vs the
offline engine on the same requests, at 1, 8 and 32 concurrent streams.

Both sides run the same closed loop: `c` requests in flight, a new one starts when one ends. The
offline side is the engine `LLM` wraps, driven in-process (LLM.generate would batch every request at
once, which is not what c clients do) on a worker thread, as the server drives it: on a busy machine
torch's 2-thread intra-op pool runs far slower from the main thread than from a worker thread, which
would otherwise swamp the HTTP cost this measures. Prompts are cut from real text, ignore_eos fixes
the output length, so both sides do the same work.

    python benchmarks/server_overhead.py [--model M] [--concurrency 1,8,32] [--repeats 3] [--threads 1]

Each level runs offline then HTTP `--repeats` times; the table shows medians, and the ratio is the
median of the per-repeat ratios, which cancels most of a shared machine's drift.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass

import httpx
import tally  # noqa: F401  first: it sets OpenMP's waiting policy before torch loads libgomp
import torch
from workload import corpus_token_ids

from tally import LLM
from tally.sampling_params import SamplingParams
from tally.server.process import ServerProcess


@dataclass
class Run:
    wall_s: float
    output_tokens: int
    ttft_s: list[float]

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s

    @property
    def ttft_p50_ms(self) -> float:
        return statistics.median(self.ttft_s) * 1000


def make_prompts(tokenizer, n: int, length: int) -> list[list[int]]:
    ids = corpus_token_ids(tokenizer)
    stride = (len(ids) - length) // n  # distinct offsets: no shared prefixes
    return [ids[i * stride:i * stride + length] for i in range(n)]


def offline(llm: LLM, prompts: list[list[int]], max_tokens: int, concurrency: int) -> Run:
    engine, params = llm.engine, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    todo, ttft, tokens, next_id = list(prompts), [], 0, 0
    t0 = time.perf_counter()
    while todo or engine.has_unfinished_requests():
        while todo and engine.num_running() + engine.num_waiting() < concurrency:
            engine.add_request(f"b{next_id}", todo.pop(0), params)
            next_id += 1
        for out in engine.step():
            if out.finished:
                tokens += len(out.outputs[0].token_ids)
                ttft.append(out.metrics.ttft_s)
    return Run(time.perf_counter() - t0, tokens, ttft)


def on_worker_thread(fn, *args) -> Run:
    result: list = []

    def target() -> None:
        try:
            result.append(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
            result.append(exc)

    t = threading.Thread(target=target)
    t.start()
    t.join()
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


async def http(url: str, model: str, prompts: list[list[int]], max_tokens: int, concurrency: int) -> Run:
    todo, ttft, tokens = list(prompts), [], 0

    async def client(c: httpx.AsyncClient) -> None:
        nonlocal tokens
        while todo:
            body = {"model": model, "prompt": todo.pop(0), "max_tokens": max_tokens, "temperature": 0,
                    "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
            start = time.perf_counter()
            first = None
            async with c.stream("POST", "/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    if first is None and chunk["choices"] and chunk["choices"][0]["text"]:
                        first = time.perf_counter() - start
                    if chunk.get("usage"):
                        tokens += chunk["usage"]["completion_tokens"]
            ttft.append(first if first is not None else time.perf_counter() - start)

    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as c:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(c) for _ in range(concurrency)))
        return Run(time.perf_counter() - t0, tokens, ttft)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="default: the built-in SmolLM2-135M")
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--requests-per-stream", type=int, default=2)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--kv-cache-memory", default="256MB")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads on both sides (OMP_NUM_THREADS)")
    ns = p.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(ns.threads)  # inherited by the server process
    torch.set_num_threads(ns.threads)
    levels = [int(x) for x in ns.concurrency.split(",")]
    from tally.units import parse_bytes

    llm = LLM(ns.model, max_model_len=ns.max_model_len, kv_cache_memory=parse_bytes(ns.kv_cache_memory))
    prompts = make_prompts(llm.get_tokenizer(), max(levels) * ns.requests_per_stream, ns.prompt_tokens)
    args = ["--max-model-len", str(ns.max_model_len), "--kv-cache-memory", ns.kv_cache_memory, "--log-level", "warning"]
    if ns.model:
        args = ["--model", ns.model, *args]
    rows = []
    with ServerProcess(args) as server:
        model = httpx.get(server.base_url + "/models").json()["data"][0]["id"]
        on_worker_thread(offline, llm, prompts[:2], 4, 2)  # warm-up both sides
        asyncio.run(http(server.base_url, model, prompts[:2], 4, 2))
        for c in levels:
            reqs = prompts[:c * ns.requests_per_stream]
            runs = [(on_worker_thread(offline, llm, reqs, ns.output_tokens, c),
                     asyncio.run(http(server.base_url, model, reqs, ns.output_tokens, c))) for _ in range(ns.repeats)]
            rows.append((c, len(reqs), runs))
    print(f"\nprompt {ns.prompt_tokens} tokens, output {ns.output_tokens} tokens (ignore_eos), greedy, "
          f"model {model}, {ns.threads} torch thread(s), median of {ns.repeats}")
    print(f"{'streams':>7} {'requests':>8} {'offline tok/s':>13} {'HTTP tok/s':>10} {'offline TTFT p50':>16} "
          f"{'HTTP TTFT p50':>13} {'HTTP/offline tok/s':>18}")
    med = statistics.median
    for c, n, runs in rows:
        off_tps, web_tps = med(o.tokens_per_s for o, _ in runs), med(w.tokens_per_s for _, w in runs)
        off_ttft, web_ttft = med(o.ttft_p50_ms for o, _ in runs), med(w.ttft_p50_ms for _, w in runs)
        ratio = med(w.tokens_per_s / o.tokens_per_s for o, w in runs)
        print(f"{c:>7} {n:>8} {off_tps:>13.1f} {web_tps:>10.1f} {off_ttft:>13.0f} ms {web_ttft:>10.0f} ms "
              f"{ratio:>18.2f}")
    print("\ncommand: python " + " ".join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
