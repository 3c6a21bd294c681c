"""KV that spills instead of recomputing: (1) TTFT of a request behind a long shared prefix (default 4,096 tokens)
cold, warm in the pool's prefix cache, and warm in the disk prefix tier after the engine restarts (the files in the
OS page cache, and dropped from it); (2) a preemption priced both ways: two long requests in a pool that holds both
prompts but not their outputs, the second preempted once, by swapping (`--preemption-mode auto`, the default, which
measures and chooses) and by recomputing, with prefix caching off and on (on, a recompute finds the blocks the
preemption gave back, unless they were handed out since). Built-in SmolLM2 (8,192-token context), default path.

    python benchmarks/kv_spill.py [--prefix-tokens 4096] [--prefixes 3] [--preempt-tokens 2000] [--repeats 3]
                             [--threads 2]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from workload import corpus_token_ids

SUFFIX_TOKENS = 24


def _llm(**kw):
    from tally import LLM

    return LLM(None, **kw)


def _ttft(llm, ids: list[int]) -> float:
    from tally import SamplingParams

    out = llm.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)[0]
    return out.metrics.ttft_s


_engines = iter(range(10_000))


def _warm_up(llm, ids: list[int]) -> None:
    """First steps of a fresh engine compile kernels for their shapes: not what a TTFT should count. Text of its
    own for each engine, so that no warm-up is a prefix hit."""
    start = 60_000 + next(_engines) * 2_300
    _ttft(llm, ids[start:start + 64])
    _ttft(llm, ids[start + 64:start + 64 + min(2100, llm.engine.max_model_len - 1)])  # chunks of the longest size


def _drop_page_cache(folder: Path) -> int:
    """Every tier file written through and dropped from the OS page cache; the bytes dropped."""
    dropped = 0
    for f in folder.rglob("*.kv"):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)  # dirty pages are not dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            dropped += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return dropped


def prefix_ttfts(ids: list[int], a: argparse.Namespace, folder: Path) -> None:
    n = a.prefix_tokens
    prefixes = [ids[20_000 + k * (n + 1000):20_000 + k * (n + 1000) + n] for k in range(a.prefixes)]
    suffix = [ids[5_000 + 100 * j:5_000 + 100 * j + SUFFIX_TOKENS] for j in range(4)]
    kw = {"max_model_len": n + 256, "kv_disk_cache_dir": str(folder), "threads": a.threads}
    cold, ram, disk_cached, disk_dropped = [], [], [], []
    first = _llm(**kw)
    _warm_up(first, ids)
    for p in prefixes:
        cold.append(_ttft(first, p + suffix[0]))
        ram.append(_ttft(first, p + suffix[1]))
    print("\n".join(line for line in first.engine.ledger.format().splitlines() if "disk" in line or "pool" in line))
    first.engine.shutdown()  # the queued blocks reach the disk
    written = first.engine.snapshot().disk_cache
    del first
    for results, drop in ((disk_cached, False), (disk_dropped, True)):
        restarted = _llm(**kw)
        _warm_up(restarted, ids)
        if drop:
            print(f"dropped {_drop_page_cache(folder) / 2**20:,.0f} MiB of tier files from the page cache")
        for p in prefixes:
            results.append(_ttft(restarted, p + suffix[2 if not drop else 3]))
        hits = restarted.engine.snapshot().disk_cache.hit_tokens
        restarted.engine.shutdown()
        del restarted
        print(f"restarted engine ({'page cache dropped' if drop else 'files in the page cache'}): "
              f"{hits:,} prompt tokens read from disk")
    print(f"\nTTFT of a {n:,}-token shared prefix + {SUFFIX_TOKENS} own tokens, median of {a.prefixes} prefixes, "
          f"{a.threads} threads; blocks written to disk: {written.written_blocks:,} "
          f"({written.held_bytes / 2**20:,.0f} MiB), dropped writes {written.dropped_writes}")
    print(f"{'prefix':<40} {'TTFT P50 s':>11} {'min s':>8} {'max s':>8} {'cold / this':>12}")
    c50 = statistics.median(cold)
    for name, xs in (("cold (computed)", cold), ("warm in RAM (prefix cache)", ram),
                     ("warm on disk, after restart (page cache)", disk_cached),
                     ("warm on disk, after restart (dropped)", disk_dropped)):
        m = statistics.median(xs)
        print(f"{name:<40} {m:>11.3f} {min(xs):>8.3f} {max(xs):>8.3f} {c50 / m:>11.1f}x")


PREEMPTION_RUNS = (  # label, --preemption-mode, prefix caching, pool (in multiples of what two prompts take)
    ("no preemption (pool for both)", "recompute", False, 4),
    ("swap (auto: measured)", "auto", False, 1),
    ("recompute", "recompute", False, 1),
    ("swap (auto), prefix caching on", "auto", True, 1),
    ("recompute, prefix caching on", "recompute", True, 1),
)


def preemption_cost(ids: list[int], a: argparse.Namespace) -> None:
    """One engine per row; each repeat sends two prompts of its own (no repeat is a prefix hit of another)."""
    from tally import SamplingParams

    n, out_tokens, bs = a.preempt_tokens, 40, 16
    pairs = [[{"prompt_token_ids": ids[40_000 + k * (n + 500):40_000 + k * (n + 500) + n]} for k in (2 * r, 2 * r + 1)]
             for r in range(a.repeats)]
    # Both prompts and their first tokens fit; the second is preempted when the first needs one more block.
    blocks = 2 * (-(-(n + 1) // bs))
    params = SamplingParams(temperature=0, max_tokens=out_tokens, ignore_eos=True)
    rows, outputs = [], []
    for label, mode, prefix_caching, pools in PREEMPTION_RUNS:
        llm = _llm(max_model_len=n + out_tokens + bs, num_gpu_blocks_override=pools * blocks, preemption_mode=mode,
                   enable_prefix_caching=prefix_caching, max_num_seqs=2, threads=a.threads)
        _warm_up(llm, ids)
        walls, e2es, tokens = [], [], []
        for prompts in pairs:
            started = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            walls.append(time.perf_counter() - started)
            e2es.append(outs[1].metrics.finished_time - outs[1].metrics.arrival_time)
            tokens.append([o.outputs[0].token_ids for o in outs])
        snap = llm.engine.snapshot()
        outputs.append(tokens)
        rows.append((label, statistics.median(walls), statistics.median(e2es), snap.num_preemptions,
                     snap.swap.num_swapped if snap.swap else 0, snap.swap))
        del llm
    print(f"\nPreemption: two {n:,}-token prompts, {out_tokens} tokens each, pool of {blocks} blocks of {bs}: the "
          f"second is preempted once; median of {a.repeats} pairs, {a.threads} threads")
    print(f"{'preemption':<34} {'wall s':>7} {'2nd request e2e s':>18} {'preemptions':>12} {'swapped':>8} "
          f"{'outputs = unpreempted':>22}")
    for (label, wall, e2e, pre, swapped, _), tokens in zip(rows, outputs):
        print(f"{label:<34} {wall:>7.2f} {e2e:>18.2f} {pre:>12} {swapped:>8} {str(tokens == outputs[0]):>22}")
    swap = rows[1][-1]
    print(f"swap space: out {swap.out_s_per_block * 1e3:.3f} ms + back {swap.in_s_per_block * 1e3:.3f} ms per block "
          f"of {blocks // 2} (measured); the auto rule's last prices: swap {swap.last_swap_s * 1e3:.1f} ms vs "
          f"recompute {swap.last_recompute_s * 1e3:.0f} ms")
    print(f"wall time recompute / swap: {rows[2][1] / rows[1][1]:.2f}x (prefix caching off), "
          f"{rows[4][1] / rows[3][1]:.2f}x (on)")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--prefix-tokens", type=int, default=4096)
    p.add_argument("--prefixes", type=int, default=3)
    p.add_argument("--preempt-tokens", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=3, help="pairs of prompts per preemption row")
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    from tally.models.loader import load_checkpoint
    from tally.models.tokenizer import load_tokenizer

    ids = corpus_token_ids(load_tokenizer(load_checkpoint(None)))
    with tempfile.TemporaryDirectory(prefix="tally-kv-spill-") as folder:
        prefix_ttfts(ids, a, Path(folder))
    preemption_cost(ids, a)
    print("command: python " + " ".join(sys.argv))


if __name__ == "__main__":
    main()
