"""What prompt lookup can gain at one stream on this machine, counted before optimising: a verify step's cost at
each number of proposals against the plain decode steps beside it, the tokens such a step makes, and from them the
most that speculation can speed up a quote prompt's answer, prefill included.

    python benchmarks/verify_cost.py [--k 7] [--requests 6] [--max-tokens 256] [--model PATH.gguf]

The built-in model (or --model) answers quote prompts (benchmarks/speculative.py's: the answer copies the prompt)
one at a time. Its decode steps run in cycles, each a shuffled order of: one plain step (as `tally serve` runs
them), a burst of plain steps (as LLM() runs them: tally/engine/multi_step.py) and one verify step at each fixed K of
1..--k; every step is timed against the cycle's plain step, so a shared host's speed, which moves between seconds,
cancels (the median of those ratios). Per proposal count p (prompt lookup proposes fewer than K where its match is
shorter): the step's cost in plain steps and the tokens such steps made (1 + the proposals kept, their mean). The
best p's tokens per plain step's time bounds the decode steps' speed-up; with the
prefill's time (its steps timed apart) and the answers' length it bounds the end-to-end one, against a server's
plain steps and against LLM()'s bursts. The bound takes a match at every step (prompt lookup finds one at the
printed share) and the policy's best K at every step; what the adaptive policy reaches is benchmarks/speculative.py.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

from speculative import quote_prompts  # benchmarks/ is on sys.path when a script here runs

from tally import LLM, SamplingParams
from tally.engine.speculation.config import SpeculativeConfig
from tally.engine.speculation.speculator import Speculator


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--k", type=int, default=7, help="the most proposals a verify step is timed at")
    p.add_argument("--requests", type=int, default=6, help="quote prompts, each answered alone")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--model", default=None, help="a .gguf file (default: the built-in SmolLM2)")
    a = p.parse_args()
    llm = LLM(a.model, max_model_len=2048, kv_cache_memory=2**30, enable_prefix_caching=False)
    engine = llm.engine
    bursts = engine._burst_limit
    speculators = {k: Speculator(SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": k,
                                                          "adaptive": False}), engine.max_model_len, None)
                   for k in range(1, a.k + 1)}
    params = SamplingParams(temperature=0.0, max_tokens=a.max_tokens)
    cost = {n: [] for n in range(a.k + 1)}  # proposals verified -> step time / the cycle's plain step's
    kept = {n: [] for n in range(a.k + 1)}  # proposals verified -> how many of them held, per step
    burst = []  # a burst's time a token / the cycle's plain step's
    prefill_s, outputs, plain_s = [], [], []
    arms = ["plain", "burst", *speculators]
    for i, prompt in enumerate(quote_prompts(a.requests, random.Random(4), 2000)):
        engine.speculator, engine._burst_limit = None, 1
        engine.add_request(f"cost-{i}", prompt, params)
        req = engine.groups[f"cost-{i}"].sequences[0].request
        started = time.perf_counter()
        while req.num_output_tokens == 0:
            engine.step()
        prefill_s.append(time.perf_counter() - started)
        order = list(arms)
        while engine.has_unfinished_requests():
            random.Random(len(plain_s)).shuffle(order)
            cycle = {}
            for arm in order:
                if not engine.has_unfinished_requests():
                    break
                engine.speculator = spec = speculators.get(arm)
                engine._burst_limit = bursts if arm == "burst" else 1
                made = req.num_output_tokens
                accepted = spec.stats.num_accepted_tokens if spec else 0
                started = time.perf_counter()
                engine.step()
                seconds = time.perf_counter() - started
                if arm == "burst":
                    cycle[arm] = seconds / (req.num_output_tokens - made)
                elif arm == "plain":
                    cycle[arm] = seconds
                else:
                    cycle[arm] = (spec.step_proposals, seconds, spec.stats.num_accepted_tokens - accepted)
            if "plain" in cycle:
                plain_s.append(cycle["plain"])
                if "burst" in cycle:
                    burst.append(cycle["burst"] / cycle["plain"])
                for arm, value in cycle.items():
                    if arm not in ("plain", "burst"):
                        proposed, seconds, held = value
                        cost[proposed].append(seconds / cycle["plain"])
                        kept[proposed].append(held)
        outputs.append(req.num_output_tokens)
    report(a, cost, kept, burst, prefill_s, plain_s, outputs)


def report(a: argparse.Namespace, cost: dict, kept: dict, burst: list, prefill_s: list, plain_s: list,
           outputs: list) -> None:
    steps = sum(len(v) for v in cost.values())
    print("| proposals | rows | step cost, plain steps | tokens a step | tokens per plain step's time | steps |\n"
          "|---|---|---|---|---|---|")
    best = (1.0, 0)
    for n in range(a.k + 1):
        if not cost[n]:
            continue
        c, made = (statistics.median(cost[n]), 1 + statistics.mean(kept[n])) if n else (1.0, 1.0)
        best = max(best, (made / c, n))
        print(f"| {n} | {n + 1} | {c:.2f} | {made:.2f} | {made / c:.2f} | {len(cost[n])} |")
    rate, k = best
    plain, prefill, tokens = statistics.median(plain_s), statistics.median(prefill_s), statistics.mean(outputs)
    per_burst = statistics.median(burst) * plain
    print(f"\nplain step {plain * 1e3:.2f} ms (LLM()'s bursts {per_burst * 1e3:.2f} ms a token); prefill "
          f"{prefill:.2f} s a prompt; {tokens:.0f} tokens an answer; prompt lookup matched at "
          f"{1 - len(cost[0]) / steps:.0%} of verify steps")
    best_s = prefill + tokens * plain / rate
    print(f"decode steps at most {rate:.2f}x (K = {k}); end to end at one stream at most "
          f"{(prefill + tokens * plain) / best_s:.2f}x a server's plain steps, "
          f"{(prefill + tokens * per_burst) / best_s:.2f}x LLM()'s bursts")
    print(f"\ncommand: python benchmarks/verify_cost.py --k {a.k} --requests {a.requests} --max-tokens {a.max_tokens}"
          + (f" --model {a.model}" if a.model else ""))


if __name__ == "__main__":
    main()
