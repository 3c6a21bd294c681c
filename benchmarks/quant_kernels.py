"""Quantized linear kernels by batch size: where each layer should leave its few-token kernel.

For every weight shape (K in -> N out) and row count M, times the real tally.quant layers on each forced path
next to dense bf16 and fp32 F.linear of the same shape, then picks, per scheme, the first M that takes the
many-token path: the threshold that minimises the mean time-over-best across all shapes and M. Those numbers are
what tally/quant/dispatch.py holds. Times are the best of N (the machine is shared; the minimum is the least
noisy). The many-token columns multiply in tally.quant.dispatch.matmul_dtype (fp32 for bf16 compute on CPUs
without AVX-512 BF16). int4 uses group 32, the built-in SmolLM2 GGUF's layout.

    python benchmarks/quant_kernels.py [--threads 2] [--fp32] [--shapes smol|all]
"""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import tally  # noqa: F401  first: it sets OpenMP's waiting policy before torch loads libgomp
import torch
import torch.nn.functional as F

from tally.layers.linear import build_linear
from tally.quant.dispatch import NEVER
from tally.quant.group_int8 import GroupInt8Linear
from tally.quant.rtn import quantize_int8_per_channel

ROWS = (1, 2, 4, 8, 16, 32, 64, 128)
SMOL_SHAPES = [(576, 1536), (1536, 576), (576, 576), (576, 192), (576, 49152)]  # (K in, N out); last: lm_head
QWEN_SHAPES = [(896, 4864), (4864, 896)]
# scheme -> (layer factory, few-path column, many-path column)
SCHEMES = {"int8": ("int8 kern", "int8 deq"), "int4": ("int4 kern", "int4 deq"),
           "w8a8": ("int8 kern", "w8a8 int_mm"), "q8_0": ("q8_0 kern", "q8_0 deq")}
# GGUF files keep Q8_0 for the token embedding (= the tied lm_head), so its threshold is chosen on that shape.
THRESHOLD_SHAPES = {"q8_0": {(576, 49152)}}


def best_ms(fn: Callable[[], object], budget_s: float = 0.25) -> float:
    fn()
    start = time.perf_counter()
    fn()
    first_s = time.perf_counter() - start
    times = [first_s]
    for _ in range(max(2, min(20, int(budget_s / max(first_s, 1e-6))))):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def forced(layer: torch.nn.Module, many: bool) -> torch.nn.Module:
    layer.many_tokens_from = 1 if many else NEVER
    return layer


def build(k: int, n: int, dtype: torch.dtype) -> tuple[torch.Tensor, dict[str, torch.nn.Module]]:
    """The dense weight and one layer per scheme, all from the same random weight."""
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(0)) * 0.05
    q, _ = quantize_int8_per_channel(w)
    block_scale = w.reshape(n, k // 32, 32).abs().amax(-1) / 127
    layers = {scheme: build_linear(w, None, quantization=scheme, dtype=dtype, group_size=32)
              for scheme in ("int8", "int4", "w8a8")}
    layers["q8_0"] = GroupInt8Linear(q, block_scale, None, dtype)
    return w, layers


def measure(shapes: list[tuple[int, int]], dtype: torch.dtype) -> dict[tuple[int, int, int], dict[str, float]]:
    results = {}
    for k, n in shapes:
        dense_w, layers = build(k, n, dtype)
        w_bf16 = dense_w.bfloat16()
        for m in ROWS:
            x = torch.randn(m, k)
            x_bf16 = x.bfloat16()
            row = {"dense bf16": best_ms(lambda: F.linear(x_bf16, w_bf16)),
                   "dense fp32": best_ms(lambda: F.linear(x, dense_w))}
            x = x.to(dtype)
            for scheme, (few_col, many_col) in SCHEMES.items():
                layer = layers[scheme]
                if scheme != "w8a8":  # W8A8's few path is int8's kernel on the same weight
                    row[few_col] = best_ms(lambda: forced(layer, False)(x))
                row[many_col] = best_ms(lambda: forced(layer, True)(x))
            results[(k, n, m)] = row
            print(f"{k}x{n} M={m:<3} " + "  ".join(f"{c} {v:.3f}" for c, v in row.items()), file=sys.stderr, flush=True)
        del dense_w, w_bf16, layers
    return results


def choose_threshold(results: dict, few_col: str, many_col: str) -> tuple[int, float]:
    """The first M on the many path that minimises mean(time / best of the two) over shapes and M."""
    def cost(threshold: int) -> float:
        total = 0.0
        for (_, _, m), row in results.items():
            chosen = row[many_col] if m >= threshold else row[few_col]
            total += chosen / min(row[few_col], row[many_col])
        return total / len(results)
    candidates = [*ROWS, NEVER]
    best = min(candidates, key=cost)
    return best, cost(best)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--fp32", action="store_true", help="compute dtype fp32 instead of bf16")
    parser.add_argument("--shapes", choices=["smol", "all"], default="all")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = torch.float32 if args.fp32 else torch.bfloat16
    shapes = SMOL_SHAPES + (QWEN_SHAPES if args.shapes == "all" else [])
    results = measure(shapes, dtype)

    columns = list(next(iter(results.values())))
    print(f"quantized linear kernels, best-of-N ms, {args.threads} threads, compute {dtype}")
    print(f"| K x N | M | {' | '.join(columns)} |")
    print("|---|---|" + "---|" * len(columns))
    for (k, n, m), row in results.items():
        print(f"| {k}x{n} | {m} | " + " | ".join(f"{row[c]:.3f}" for c in columns) + " |")
    print("\nthreshold = first M on the many-token path (mean time over the better path at that threshold)")
    for scheme, (few_col, many_col) in SCHEMES.items():
        shapes_for = THRESHOLD_SHAPES.get(scheme)
        rows = {key: row for key, row in results.items() if shapes_for is None or key[:2] in shapes_for}
        if not rows:
            continue
        threshold, mean_ratio = choose_threshold(rows, few_col, many_col)
        label = "never" if threshold == NEVER else str(threshold)
        print(f"  {scheme}: {label} ({mean_ratio:.3f})")
    print(f"\ncommand: python benchmarks/quant_kernels.py {' '.join(sys.argv[1:])}".rstrip())


if __name__ == "__main__":
    main()
