"""One engine's steps alternating, step by step, between this checkout's native kernels and another version's
(--baseline REF, a git ref), in one process: the built-in model (or --model) answering quote prompts one at a time,
with speculation off (K = 0: LLM()'s bursts of decode steps) and prompt lookup at each fixed K of --k (verify steps
of K + 1 rows). Printed per K: each side's median step and the median over pairs of adjacent steps of REF's time
over this checkout's. A shared host's speed moves between seconds (whole runs of the same command differed 1.5x
here), and adjacent steps see the same speed: this measures a kernel change's effect on whole steps where timing
whole runs cannot. Both sides compute the same bits (the kernels' own tests hold them to that), so the requests'
tokens, and so the steps' shapes, are the same either way. --mixed N instead times the floor step of a latency
target (--max-itl): N streams decoding beside a --prompt-tokens prompt prefilled 16 tokens a step; its pairs are also
given over the prompt's last quarter, where its rows see the most keys.

    python benchmarks/step_ab.py --baseline REF [--k 0,3,6] [--requests 6] [--model PATH.gguf]
    python benchmarks/step_ab.py --baseline REF --mixed 16 [--prompt-tokens 3500]
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

import tally.models.native_decode_step as native_decode_step
import tally.native.ops as native_ops
from batch_invariance import baseline_build  # benchmarks/ is on sys.path when a script here runs
from speculative import quote_prompts
from workload import corpus_token_ids

from tally import LLM, SamplingParams
from tally.engine.speculation.config import SpeculativeConfig
from tally.engine.speculation.speculator import Speculator
from tally.native import library


def use(lib) -> None:
    """Every later kernel call of the engine's (its layers' ops and the one-call decode step) goes to `lib`."""
    native_ops.load = native_decode_step.load = lambda: lib


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", required=True, help="git ref whose kernels alternate with this checkout's")
    p.add_argument("--k", default="0,3,6", help="speculative tokens a verify step (0: speculation off)")
    p.add_argument("--requests", type=int, default=6, help="quote prompts per K, each answered alone")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--model", default=None, help="a .gguf file (default: the built-in SmolLM2)")
    p.add_argument("--mixed", type=int, default=0, help="streams decoding beside a prompt's 16-token chunks "
                   "(instead of --k)")
    p.add_argument("--prompt-tokens", type=int, default=3500, help="--mixed: the prompt's length")
    a = p.parse_args()
    here = library.load_build(library.builds()[library.build_wanted()])
    sides = {"baseline": baseline_build(a.baseline), "here": here}
    if a.mixed:
        mixed(a, sides)
        return
    llm = LLM(a.model, max_model_len=2048, kv_cache_memory=2**30, enable_prefix_caching=False)
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=a.max_tokens)
    print(f"| K | {a.baseline} median step ms | this checkout's | {a.baseline} / this, paired | pairs |")
    print("|---|---|---|---|---|")
    for k in (int(v) for v in a.k.split(",")):
        times, ratios = {side: [] for side in sides}, []
        for i, prompt in enumerate(quote_prompts(a.requests, random.Random(1), 2000)):
            engine.speculator = None if k == 0 else Speculator(SpeculativeConfig.parse(
                {"method": "ngram", "num_speculative_tokens": k, "adaptive": False}), engine.max_model_len, None)
            engine.add_request(f"ab-{k}-{i}", prompt, params)
            use(here)
            engine.step()  # the prompt: not timed
            order = ("baseline", "here") if i % 2 == 0 else ("here", "baseline")  # who goes first, in turn
            steps = {side: [] for side in sides}
            while engine.has_unfinished_requests():
                side = order[sum(map(len, steps.values())) % 2]
                use(sides[side])
                started = time.perf_counter()
                engine.step()
                steps[side].append(time.perf_counter() - started)
            ratios += [b / h for b, h in zip(steps["baseline"], steps["here"])]
            for side in sides:
                times[side] += steps[side]
        use(sides["here"])
        ms = {side: 1e3 * statistics.median(t) for side, t in times.items()}
        print(f"| {k} | {ms['baseline']:.2f} | {ms['here']:.2f} | {statistics.median(ratios):.3f}x | {len(ratios)} |",
              flush=True)
    print(f"\ncommand: python benchmarks/step_ab.py --baseline {a.baseline} --k {a.k} --requests {a.requests} "
          f"--max-tokens {a.max_tokens}" + (f" --model {a.model}" if a.model else ""))


def mixed(a: argparse.Namespace, sides: dict) -> None:
    """--mixed: steps of a.mixed decodes and a 16-token chunk of one long prompt, alternating between the sides."""
    chunk = 16
    llm = LLM(a.model, max_model_len=a.prompt_tokens + 512, kv_cache_memory=2**30, enable_prefix_caching=False,
              max_num_batched_tokens=a.mixed + chunk, max_num_seqs=a.mixed + 1)
    engine = llm.engine
    corpus = corpus_token_ids(llm.get_tokenizer())
    streams = SamplingParams(temperature=0.0, max_tokens=a.prompt_tokens, ignore_eos=True)
    for i in range(a.mixed):
        engine.add_request(f"stream-{i}", {"prompt_token_ids": corpus[64 * i:64 * i + 64]}, streams)
    use(sides["here"])
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.running) or \
            len(engine.scheduler.running) < a.mixed:
        engine.step()  # the streams' prompts: not timed
    engine.add_request("long", {"prompt_token_ids": corpus[-a.prompt_tokens:]},
                       SamplingParams(temperature=0.0, max_tokens=1))
    steps: list[tuple[str, float]] = []
    prefilled = False
    while not prefilled:  # the prompt's first token ends it
        side = ("baseline", "here")[len(steps) % 2]
        use(sides[side])
        started = time.perf_counter()
        outputs = engine.step()
        steps.append((side, time.perf_counter() - started))
        prefilled = any(out.request_id == "long" for out in outputs)
    use(sides["here"])
    pairs = [(b, h) for (_, b), (_, h) in zip(steps[0::2], steps[1::2])]
    last = pairs[len(pairs) * 3 // 4:]
    print(f"| streams | {a.baseline} median step ms | this checkout's | {a.baseline} / this, paired | "
          "last quarter's pairs |")
    print("|---|---|---|---|---|")
    print(f"| {a.mixed} + 16 prompt tokens | {1e3 * statistics.median(b for b, _ in pairs):.1f} | "
          f"{1e3 * statistics.median(h for _, h in pairs):.1f} | {statistics.median(b / h for b, h in pairs):.3f}x | "
          f"{statistics.median(b / h for b, h in last):.3f}x |")
    print(f"\ncommand: python benchmarks/step_ab.py --baseline {a.baseline} --mixed {a.mixed} "
          f"--prompt-tokens {a.prompt_tokens}" + (f" --model {a.model}" if a.model else ""))


if __name__ == "__main__":
    main()
