"""Reference (gather + SDPA) vs tiled (online softmax) vs auto attention on long prefills, one layer.

Prints one table: per case, the median time of each backend, its peak extra CPU memory (from the
torch profiler's allocation events, cache and inputs excluded,
the 4.5 MiB output included), the bytes of the [Hq, Lq, Lk]
fp32 score matrix that a naive kernel would materialise, and each time over the reference's.

    python benchmarks/attention_tiled.py [--threads 1] [--repeats 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import tally  # noqa: F401  first: it sets OpenMP's waiting policy before torch loads libgomp
import torch
from torch.profiler import ProfilerActivity, profile

from tally.attention import AttentionMetadata, make_backend

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 9, 3, 64, 16  # SmolLM2-135M's attention shape
# (name, tokens already in the cache, new tokens, sliding window)
CASES = [("prefill 2048", 0, 2048, None), ("chunk 2048 after 2048", 2048, 2048, None),
         ("prefill 2048, window 512", 0, 2048, 512)]


def make_inputs(cached: int, new: int):
    gen = torch.Generator().manual_seed(0)
    ctx = cached + new
    num_blocks = -(-ctx // BLOCK_SIZE)
    k_cache = torch.randn(num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM, generator=gen)
    v_cache = torch.randn_like(k_cache)
    table = torch.randperm(num_blocks, generator=gen)
    positions = torch.arange(cached, ctx)
    meta = AttentionMetadata(
        query_start_loc=[0, new], context_lens=[ctx], block_tables=table[None],
        slot_mapping=table[positions // BLOCK_SIZE] * BLOCK_SIZE + positions % BLOCK_SIZE,
        block_size=BLOCK_SIZE,
    )
    q = torch.randn(new, HEADS, HEAD_DIM, generator=gen)
    k = torch.randn(new, KV_HEADS, HEAD_DIM, generator=gen)
    return q, k, torch.randn_like(k), k_cache, v_cache, meta


def peak_extra_bytes(fn) -> int:
    """Highest running total of bytes allocated minus freed while fn runs."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    # The raw event list: prof.events() drops the allocations that belong to an operator.
    events = prof.profiler.kineto_results.events()
    deltas = [(e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]"]
    running = peak = 0
    for _, delta in sorted(deltas):
        running += delta
        peak = max(peak, running)
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print("| case | backend | median ms | peak extra MiB (output incl.) | naive score matrix MiB "
          "| time / reference time |")
    print("|---|---|---|---|---|---|")
    for label, cached, new, window in CASES:
        inputs = make_inputs(cached, new)
        score_mib = HEADS * new * (cached + new) * 4 / 2**20
        runs = {}
        for name in ("reference", "tiled", "auto"):
            backend = make_backend(name, num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                                   scale=HEAD_DIM ** -0.5, sliding_window=window)
            runs[name] = lambda backend=backend: backend.forward(*inputs)
            runs[name]()  # warm up
        samples_ms = {name: [] for name in runs}
        for _ in range(args.repeats):  # interleaved, so both backends see the same machine load
            for name, run in runs.items():
                t0 = time.perf_counter()
                run()
                samples_ms[name].append((time.perf_counter() - t0) * 1e3)
        median_ms = {name: statistics.median(samples) for name, samples in samples_ms.items()}
        for name, run in runs.items():
            ratio = "" if name == "reference" else f"{median_ms[name] / median_ms['reference']:.2f}"
            print(f"| {label} | {name} | {median_ms[name]:.1f} | {peak_extra_bytes(run) / 2**20:.1f} "
                  f"| {score_mib:.0f} | {ratio} |")
    print(f"\ncommand: python {' '.join(sys.argv)}  (torch {torch.__version__}, {args.threads} thread(s))")


if __name__ == "__main__":
    main()
