"""int8 tiles whose weights lie within ±16 (a GGUF's Q5_0 rows widened to int8 beside Q8_0 ones) against full-range
int8 tiles of the same shape, in a prompt's pass of many rows: the first add a block's byte products up in int16 and
widen once (tally/native/int_tiles.h: narrow_int8_tile), the second widen each. Same build, same multiply-adds.

    python benchmarks/narrow_int8.py [--shape 1536x640] [--narrow-rows 1280] [--rows 512] [--threads 1]
"""
from __future__ import annotations

import argparse
import sys
import time

import tally  # noqa: F401  first: it sets OpenMP's waiting policy before torch loads libgomp
import torch

from tally.native import ops


def best_ms(x: torch.Tensor, q: torch.Tensor, n: int, repeats: int) -> float:
    packed, scales = ops.pack_q8(q), ops.pack_tile_scales(torch.rand(n, q.shape[1] // 32) / 100)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        ops.gemm_q8(x, packed, scales, None, 32, n)
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="1536x640", help="N x K: Gemma-3-270M's fused q/k/v")
    p.add_argument("--narrow-rows", type=int, default=1280, help="output rows within ±16 (Gemma's q and k)")
    p.add_argument("--rows", type=int, default=512)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=20)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    n, k = (int(v) for v in a.shape.split("x"))
    gen = torch.Generator().manual_seed(0)
    wide = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
    narrow = wide.clone()
    narrow[:a.narrow_rows] = torch.randint(-16, 16, (a.narrow_rows, k), dtype=torch.int8, generator=gen)
    x = torch.randn(a.rows, k, generator=gen)
    runs = {"wide": [], "narrow": []}
    for _ in range(3):  # alternating, so a drifting machine shows in both
        runs["wide"].append(best_ms(x, wide, n, a.repeats))
        runs["narrow"].append(best_ms(x, narrow, n, a.repeats))
    wide_ms, narrow_ms = min(runs["wide"]), min(runs["narrow"])
    print(f"| gemm_q8 {a.rows} x {n} x {k}, {a.narrow_rows} rows within ±16, {a.threads} thread(s) "
          f"| {narrow_ms:.1f} ms | full-range int8 {wide_ms:.1f} ms | {wide_ms / narrow_ms:.2f}x |")
    print("command: python " + " ".join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
