"""How fast one way of running a model's projections is on this CPU, measured on the model's own shapes.

A path is a compute dtype and a weight dtype for dense projections; each projection keeps the storage the
model gives it (dense, int4 / int8 groups, W8A8), and its layer is made by tally/layers/linear.py, as the
builder makes it, from random numbers of the right shape and kind. Timing at one row reads each layer's weights
once per call from a rotating set of copies (as many as the model holds, within a byte budget), so a decode
step's weights come from memory or the last-level cache as they do when the model runs; at many rows the work
is compute-bound and one copy serves. Times are per model pass: a shape's call times its count of layers.
"""
from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from tally.layers.dense import Fp16WeightLinear
from tally.layers.huge_pages import move_weights_to_huge_pages
from tally.layers.linear import build_linear, int4_linear, int8_linear, linear_from_blocks, offset_linear, w8a8_linear
from tally.quant.base import QuantLinear
from tally.quant.dispatch import NEVER
from tally.quant.gguf_blocks import OffsetBlocks, TableBlocks
from tally.quant.native_linear import NativeInt4Linear, NativeInt8Linear

MIN_TIME_S = 0.02  # per (shape, rows): enough calls to see past timer and scheduler noise
# ... and never fewer calls than this: one call of a many-row shape outlasts MIN_TIME_S, and one call is a draw from
# the machine's noise, which can send a row count to the slower path
MIN_CALLS = 3
MAX_CALLS = 64
ROW_BLOCK = 64


@dataclass(frozen=True)
class ProjectionShape:
    name: str  # qkv, o, gate_up, down, lm_head
    out_features: int
    in_features: int
    count: int  # layers holding it
    storage: str  # dense | int4 | int5 | int6 | lut4 | int8 | w8a8 (GGUF's Q5_0 / Q6_K; IQ4_NL, IQ4_XS, MXFP4)
    group_size: int = 0  # int4 / int5 / int6 / int8 groups (0: per output channel)
    decode_only: bool = False  # the LM head sees one row per sequence, never a prompt's rows

    def weight_bytes(self, weight_dtype: torch.dtype) -> float:
        per_weight = {"dense": weight_dtype.itemsize, "int4": 0.5, "int5": 0.625, "int6": 0.75, "lut4": 0.5,
                      "int8": 1.0, "w8a8": 1.0}[self.storage]
        return self.out_features * self.in_features * per_weight


@dataclass(frozen=True)
class ComputePath:
    compute_dtype: torch.dtype
    weight_dtype: torch.dtype  # of dense projections: the compute dtype, or fp16 panels under fp32 compute


def timing_layers(shape: ProjectionShape, path: ComputePath, copies: int, gen: torch.Generator) -> list[nn.Module]:
    """`copies` layers of one shape, each with its own weight memory, packed as the builder packs a checkpoint's
    (quantized ones once, then copied). The kernels' time does not depend on the values, and drawing 136 M random
    integers for a large vocabulary's head takes longer than timing it: rows repeat a drawn block of ROW_BLOCK."""
    n, k = shape.out_features, shape.in_features

    def rows(draw) -> torch.Tensor:
        return draw((min(n, ROW_BLOCK), k)).repeat(-(-n // ROW_BLOCK), 1)[:n].contiguous()

    if shape.storage == "dense":
        w = rows(lambda size: torch.randn(size, generator=gen) * 0.02)
        return [build_linear(w.clone(), None, quantization=None, dtype=path.compute_dtype,
                             weight_dtype=path.weight_dtype) for _ in range(copies)]
    first = _quantized_layer(shape, path, rows, gen)
    if isinstance(first, QuantLinear):  # packing once and copying the buffers is many times faster than packing each
        return [first, *(copy.deepcopy(first) for _ in range(copies - 1))]
    return [first, *(_quantized_layer(shape, path, rows, gen) for _ in range(copies - 1))]


def _quantized_layer(shape: ProjectionShape, path: ComputePath, rows: Callable, gen: torch.Generator) -> nn.Module:
    """One layer of `shape`'s quantized storage, as the builder would make it on `path`."""
    n, k = shape.out_features, shape.in_features
    if shape.storage == "int4":
        q = rows(lambda size: torch.randint(0, 16, size, dtype=torch.uint8, generator=gen))
        scale = torch.rand(n, k // shape.group_size, generator=gen) * 0.01
        return int4_linear(q, scale, torch.zeros_like(scale), shape.group_size, None, path.compute_dtype)
    if shape.storage in ("int5", "int6"):
        bits = int(shape.storage[-1])
        q = rows(lambda size: torch.randint(0, 1 << bits, size, dtype=torch.uint8, generator=gen))
        blocks = OffsetBlocks(q, torch.rand(n, k // shape.group_size, generator=gen) * 0.01, bits)
        return offset_linear(blocks, None, path.compute_dtype) or build_linear(
            blocks.q.float(), None, quantization=None, dtype=path.compute_dtype, weight_dtype=path.weight_dtype)
    if shape.storage == "lut4":
        q = rows(lambda size: torch.randint(0, 16, size, dtype=torch.uint8, generator=gen))
        table = torch.randint(-127, 128, (16,), dtype=torch.int8, generator=gen)
        return linear_from_blocks(TableBlocks(q, torch.rand(n, k // 32, generator=gen) * 0.01, table), None,
                                  compute_dtype=path.compute_dtype)
    q = rows(lambda size: torch.randint(-127, 128, size, dtype=torch.int8, generator=gen))
    if shape.storage == "w8a8":
        return w8a8_linear(q, torch.rand(n, generator=gen) * 0.01, None, path.compute_dtype)
    groups = 1 if shape.group_size in (0, k) else k // shape.group_size
    scale = torch.rand(n, groups, generator=gen) * 0.01
    return int8_linear(q, scale.squeeze(1) if groups == 1 else scale, None, path.compute_dtype)


@dataclass
class PathTimes:
    """Seconds per model pass by row count: with each layer's own kernels, and (where every projection can
    take it) with rows sent on to a bf16 matmul over weights dequantized per call."""
    own: dict[int, float]
    bf16_many: dict[int, float] | None = None


def bf16_many_tokens_capable(layer: nn.Module) -> bool:
    """Native integer layers and fp16 panels: their stored weights convert to bf16 a few tiles at a time."""
    return isinstance(layer, (NativeInt4Linear, NativeInt8Linear)) or (
        isinstance(layer, Fp16WeightLinear) and layer.panels is not None and layer.panel_dtype == torch.float16)


def use_bf16_many_tokens(layers: list[nn.Module], from_rows: int) -> None:
    for layer in layers:
        if bf16_many_tokens_capable(layer):
            layer.use_many_tokens(from_rows, torch.bfloat16)


def time_path(shapes: list[ProjectionShape], path: ComputePath, rows: tuple[int, ...], budget_bytes: float,
              try_bf16_many: bool = False) -> PathTimes:
    """Each time is the sum over shapes of one call's time × its count of layers (LM-head shapes only at rows
    decode steps reach: at most 64). `try_bf16_many` also times rows > 1 on the bf16 many-token path."""
    gen = torch.Generator().manual_seed(0)
    times = PathTimes({r: 0.0 for r in rows})
    per_shape_budget = budget_bytes / max(len(shapes), 1)
    with torch.inference_mode():
        built = []
        for shape in shapes:
            copies = int(min(shape.count, max(1, per_shape_budget // shape.weight_bytes(path.weight_dtype))))
            built.append((shape, timing_layers(shape, path, copies, gen)))
        # the weights in the memory the model's will be in (the builder moves them as well)
        move_weights_to_huge_pages(nn.ModuleList([layer for _, layers in built for layer in layers]))
        if try_bf16_many and all(bf16_many_tokens_capable(layers[0]) for _, layers in built):
            times.bf16_many = {r: 0.0 for r in rows if r > 1}
        for shape, layers in built:
            for r in rows:
                if shape.decode_only and r > 64:
                    continue
                x = torch.randn(r, shape.in_features, generator=gen).to(path.compute_dtype)
                # past 64 rows the work is compute-bound: one copy serves, and warming every copy would be slow
                use = layers if r <= 64 else layers[:1]
                times.own[r] += _call_time(use, x) * shape.count
                if times.bf16_many is not None and r > 1:
                    use_bf16_many_tokens(use, 1)
                    times.bf16_many[r] += _call_time(use, x) * shape.count
                    use_bf16_many_tokens(use, NEVER)
    return times


def _call_time(layers: list[nn.Module], x: torch.Tensor) -> float:
    """The lower quartile of single calls' times: a neighbour process that takes the core for a moment slows
    some calls, not the kernel, so the quartile ranks paths as a quiet machine would."""
    for layer in layers:  # warm-up: first-call setup, and the weights where a running model would have them
        layer(x)
    times: list[float] = []
    spent = 0.0
    while len(times) < MAX_CALLS and (spent < MIN_TIME_S or len(times) < max(MIN_CALLS, min(len(layers), 4))):
        start = time.perf_counter()
        layers[len(times) % len(layers)](x)
        times.append(time.perf_counter() - start)
        spent += times[-1]
    return sorted(times)[len(times) // 4]
