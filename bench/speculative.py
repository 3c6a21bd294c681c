"""Speculative decoding on the built-in model (or --model): tokens/s with speculation off, prompt lookup at a fixed K,
and prompt lookup with the adaptive policy, at several concurrencies, on two workloads; with --draft-model, a draft
model at a fixed K and adaptive too (it must share the target's tokenizer: e.g. Qwen2.5-Coder-1.5B-Instruct with
Qwen2.5-Coder-0.5B-Instruct). Greedy: in float32 every arm
gives the same tokens; in bf16 a token computed in a verify row (several positions of one sequence) may round
differently from one computed alone, as with any change of batch shape, so the share of requests whose tokens
match `off` exactly is printed beside each figure.

  quote   questions answered by quoting a document given in the prompt (a Shakespeare scene, asked to repeat a
          speech): the output copies the prompt, prompt lookup's best case
  code    code completion: the first lines of a Python function from this repository, continued

A closed loop per concurrency C: C requests in flight on the offline engine, each replaced when it finishes,
--requests-per-slot x C requests in all. Ratios are against `off` in the same run.

    python bench/speculative.py [--concurrency 1,4,16,32] [--workloads quote,code] [--k 4] [--max-tokens 96]
                                [--model target.gguf --draft-model draft.gguf]
"""
from __future__ import annotations

import argparse
import random
from pathlib import Path

from closed_loop import closed_loop  # bench/ is on sys.path when a script here runs

from tally import LLM, SamplingParams
from tally.traces import DATA_DIR

ARMS = {
    "off": None,
    "ngram K fixed": {"method": "ngram", "adaptive": False},
    "ngram adaptive": {"method": "ngram"},
}
DRAFT_ARMS = {
    "draft K fixed": {"method": "draft_model", "adaptive": False},
    "draft adaptive": {"method": "draft_model"},
}
SOURCE_FILES = sorted((Path(__file__).resolve().parents[1] / "tally").rglob("*.py"))


def quote_prompts(n: int, rng: random.Random) -> list[str]:
    text = (DATA_DIR / "shakespeare.txt").read_text()
    prompts = []
    for _ in range(n):
        start = rng.randrange(10_000, len(text) - 3_000)
        passage = text[start:start + 1_500]
        opening = passage[600:680]
        prompts.append(f"Read this scene.\n\n{passage}\n\nQuote the speech that begins \"{opening}\" word for word, "
                       f"to its end.\n\n{opening}")
    return prompts


def code_prompts(n: int, rng: random.Random) -> list[str]:
    prompts = []
    while len(prompts) < n:
        lines = rng.choice(SOURCE_FILES).read_text().splitlines()
        starts = [i for i, line in enumerate(lines) if line.lstrip().startswith("def ")]
        if starts:
            i = rng.choice(starts)
            prompts.append("\n".join(lines[max(0, i - 40):i + 4]) + "\n")
    return prompts


WORKLOADS = {"quote": quote_prompts, "code": code_prompts}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", default="1,4,16,32")
    p.add_argument("--workloads", default="quote,code")
    p.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--requests-per-slot", type=int, default=2)
    p.add_argument("--min-requests", type=int, default=6)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--model", default=None, help="the target (default: the built-in model)")
    p.add_argument("--draft-model", default=None, help="adds the draft-model arms, this model proposing")
    p.add_argument("--arms", default=None, help="comma-separated arms to run (default: all; off always runs)")
    a = p.parse_args()
    params = SamplingParams(temperature=0.0, max_tokens=a.max_tokens)
    arms = {**ARMS, **({arm: {**cfg, "model": a.draft_model} for arm, cfg in DRAFT_ARMS.items()}
                       if a.draft_model else {})}
    if a.arms:
        arms = {arm: cfg for arm, cfg in arms.items() if arm == "off" or arm in a.arms.split(",")}
    llms = {arm: LLM(a.model, max_model_len=2048, kv_cache_memory=1 << 30, dtype=a.dtype,
                     speculative_config=None if cfg is None else {**cfg, "num_speculative_tokens": a.k})
            for arm, cfg in arms.items()}
    rows = []
    for workload in a.workloads.split(","):
        for c in (int(x) for x in a.concurrency.split(",")):
            prompts = WORKLOADS[workload](max(a.min_requests, a.requests_per_slot * c), random.Random(c))
            results = {}
            for arm, llm in llms.items():
                spec = llm.engine.speculator
                before = (spec.stats.num_draft_tokens, spec.stats.num_accepted_tokens) if spec else (0, 0)
                tok_s, tokens = closed_loop(llm, prompts, c, params)
                drafted = spec.stats.num_draft_tokens - before[0] if spec else 0
                accepted = spec.stats.num_accepted_tokens - before[1] if spec else 0
                results[arm] = (tok_s, tokens, drafted, accepted)
            for arm, (tok_s, tokens, drafted, accepted) in results.items():
                same = sum(t == o for t, o in zip(tokens, results["off"][1])) / len(prompts)
                rows.append((workload, c, arm, tok_s, tok_s / results["off"][0], drafted, accepted, same))
                print(f"{workload:<6} C={c:<3} {arm:<15} {tok_s:8.1f} tok/s  {tok_s / results['off'][0]:5.2f}x  "
                      f"proposed {drafted:6d}  accepted {accepted:6d}  same tokens: {same:.0%}", flush=True)
    print("\n| workload | concurrency | arm | tok/s | vs off | proposed | accepted | acceptance | same tokens as off |")
    print("|---|---|---|---|---|---|---|---|---|")
    for workload, c, arm, tok_s, ratio, drafted, accepted, same in rows:
        rate = f"{accepted / drafted:.0%}" if drafted else "—"
        print(f"| {workload} | {c} | {arm} | {tok_s:.1f} | {ratio:.2f}× | {drafted:,} | {accepted:,} | {rate} | "
              f"{same:.0%} |")
    flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items())
    print(f"\ncommand: python bench/speculative.py {flags}")


if __name__ == "__main__":
    main()
