"""What sampling costs a decode step: batch-1 decode with each common sampling setting against greedy decode of the
same model, in one process, the settings taking turns round by round (on a VM the memory's rate drifts within
minutes, so each round's ratio is to its own greedy run). Greedy runs several decode steps a native call in LLM()
(tally/engine/multi_step.py); a sampled request runs one step a call, so its ratio holds the sampler's own time
(tally/sample/sampler.py) and the interpreter's per-step work (docs/benchmarks.md#sampler).
Unseeded requests, as a server gets most of them.

    python benchmarks/sampling_cost.py [--model M] [--tokens 128] [--rounds 3] [--threads 2]
"""
from __future__ import annotations

import argparse
import statistics
import time

import tally  # noqa: F401  first: it sets OpenMP's waiting policy before torch loads libgomp
import torch

from tally import LLM, SamplingParams

SETTINGS = {
    "greedy": {"temperature": 0.0},
    "temperature 0.7 (vLLM's other defaults)": {"temperature": 0.7},
    "temperature 0.7, top-k 40": {"temperature": 0.7, "top_k": 40},
    "temperature 0.7, top-p 0.9": {"temperature": 0.7, "top_p": 0.9},
    "Qwen2.5's generation config": {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05},
    "llama.cpp's defaults": {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05},
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="a GGUF or HF checkpoint (default: the built-in model)")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    llm = LLM(a.model, max_model_len=1024, kv_cache_memory=128 * 2**20, enable_prefix_caching=False)
    params = {name: SamplingParams(max_tokens=a.tokens, ignore_eos=True, **kw) for name, kw in SETTINGS.items()}
    prompt = "Once upon a time"
    seconds: dict[str, list[float]] = {name: [] for name in SETTINGS}
    for name in SETTINGS:  # warm-up
        llm.generate(prompt, params[name], use_tqdm=False)
    for r in range(a.rounds):
        for name in (list(SETTINGS) if r % 2 == 0 else list(reversed(SETTINGS))):
            start = time.perf_counter()
            llm.generate(prompt, params[name], use_tqdm=False)
            seconds[name].append(time.perf_counter() - start)
    print(f"model {a.model or 'built-in'}; {a.threads} threads; {a.tokens} tokens a request; medians of "
          f"{a.rounds} rounds")
    print("| setting | tok/s | ms a token | greedy's speed over it, round by round |")
    print("|---|---|---|---|")
    for name, times in seconds.items():
        ratios = [t / g for t, g in zip(times, seconds["greedy"])]
        med = statistics.median(times)
        print(f"| {name} | {a.tokens / med:.1f} | {med / a.tokens * 1e3:.2f} | "
              f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) |")


if __name__ == "__main__":
    main()
