"""Prefix caching: 50 requests sharing a 1,500-token system prompt, sent one after another; TTFT
P50/P90 with prefix caching on vs off, same engine settings, same run.

    python benchmarks/prefix_cache_ttft.py [--requests 50] [--system-tokens 1500]
"""
from __future__ import annotations

import argparse
import statistics
import sys

import tally  # noqa: F401  first: it sets OpenMP's waiting policy before torch loads libgomp
import torch
from workload import corpus_token_ids


def ttfts(enable: bool, system: list[int], suffixes: list[list[int]], model: str | None) -> tuple[list[float], float]:
    from tally import LLM, SamplingParams

    llm = LLM(model, max_model_len=2048, kv_cache_memory=512 * 2**20, enable_prefix_caching=enable)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    out = []
    for s in suffixes:
        o = llm.generate({"prompt_token_ids": system + s}, params)[0]
        out.append(o.metrics.ttft_s)
    return out[1:], llm.engine.snapshot().prefix_hit_rate  # the first request fills the cache in both runs


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=50)
    p.add_argument("--system-tokens", type=int, default=1500)
    p.add_argument("--model", default=None)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    from tally.models.loader import load_checkpoint
    from tally.models.tokenizer import load_tokenizer

    ids = corpus_token_ids(load_tokenizer(load_checkpoint(a.model)))
    system = ids[:a.system_tokens]
    suffixes = [ids[5000 + 40 * i:5000 + 40 * i + 20 + i % 20] for i in range(a.requests)]
    off, _ = ttfts(False, system, suffixes, a.model)
    on, hit = ttfts(True, system, suffixes, a.model)
    p50_off, p50_on = statistics.median(off), statistics.median(on)
    print(f"\nworkload: {a.requests} requests, {a.system_tokens}-token shared system prompt + 20-39 own tokens, "
          f"sent one at a time, {a.threads} threads")
    print(f"{'prefix caching':<16} {'TTFT P50 s':>11} {'TTFT max s':>11}")
    print(f"{'off':<16} {p50_off:>11.3f} {max(off):>11.3f}")
    print(f"{'on':<16} {p50_on:>11.3f} {max(on):>11.3f}")
    print(f"prefix hit rate (tokens reused / prompt tokens) with caching on: {hit:.1%}")
    print(f"TTFT P50 off / on: {p50_off / p50_on:.1f}x")
    print("command: python " + " ".join(sys.argv))


if __name__ == "__main__":
    main()
