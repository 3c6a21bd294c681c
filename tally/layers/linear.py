"""The one place that decides which layer serves a projection.

Every projection of every model is built here, whatever it starts from: a dense weight (kept dense, stored in
fp16 for fp32 compute, or quantized on the fly with RTN), the integers of a pre-quantized checkpoint, or a GGUF
file's blocks. The choice between Tally's native CPU kernels (tally/quant/native_linear.py) and the PyTorch
layers (tally/quant/int4.py, int8.py, group_int8.py, w8a8.py) is made here and nowhere else: native where the
compute dtype is fp32 and the kernels build on this CPU (tally/platform.py), PyTorch's otherwise.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tally.errors import ConfigError
from tally.layers.dense import Bf16PanelLinear, DenseLinear, Fp16WeightLinear, Fp32PanelLinear
from tally.native import ops as native
from tally.quant.base import QuantLinear
from tally.quant.gguf_blocks import Blocks, GroupValues, Int4Blocks, OffsetBlocks, TableBlocks, read_blocks
from tally.quant.group_int8 import BLOCK as GROUP_INT8_BLOCK
from tally.quant.group_int8 import GroupInt8Linear
from tally.quant.int4 import Int4Linear
from tally.quant.int8 import Int8Linear
from tally.quant.native_linear import (
    NativeInt4Linear,
    NativeInt8Linear,
    NativeTableLinear,
    NativeW8A8Linear,
    native_supported,
)
from tally.quant.rtn import quantize_int4_groupwise, quantize_int8_per_channel
from tally.quant.w8a8 import W8A8Linear

SCHEMES = ("none", "int8", "int4", "w8a8")
INT4_GROUP_SIZES = (32, 64, 128)
PANEL_LAYERS = {torch.float32: Fp32PanelLinear, torch.bfloat16: Bf16PanelLinear}


def fp16_weights_supported() -> bool:
    return native.available() or "fbgemm" in torch.backends.quantized.supported_engines


def build_linear(weight: torch.Tensor, bias: torch.Tensor | None, *, quantization: str | None,
                 dtype: torch.dtype, weight_dtype: torch.dtype | None = None,
                 group_size: int | None = None) -> nn.Module:
    """weight [out, in] (HF layout) -> a module mapping [..., in] to [..., out] in `dtype`.

    quantization None / "none": dense; `weight_dtype=torch.float16` (fp32 compute only) stores it in fp16;
    `weight_dtype` equal to an fp32 or bf16 compute dtype keeps it in the native kernel's panels (row-independent
    sums: Fp32PanelLinear, Bf16PanelLinear), where the kernels build.
    "int8" / "int4" / "w8a8": rounded to nearest here ("w8a8" unsmoothed; SmoothQuant goes through
    `w8a8_from_float`). int4's `group_size` defaults to the largest of 128, 64, 32 that divides the layer."""
    if quantization in (None, "none"):
        if weight_dtype == torch.float16 and dtype == torch.float32:
            return Fp16WeightLinear(weight, bias)
        if weight_dtype == dtype and dtype in PANEL_LAYERS and native.available():
            return PANEL_LAYERS[dtype](weight, bias)
        return DenseLinear(weight, bias, dtype)
    if quantization == "int8":
        q, scale = quantize_int8_per_channel(weight, scale_dtype=dtype)
        return int8_linear(q, scale, bias, dtype)
    if quantization == "w8a8":
        return w8a8_from_float(weight, bias, dtype)
    if quantization == "int4":
        in_features = weight.shape[1]
        if group_size is None:
            group_size = next((g for g in (128, 64, 32) if in_features % g == 0), 128)
        _check_group_size(in_features, group_size)
        q, scale, zero = quantize_int4_groupwise(weight, group_size, scale_dtype=dtype)
        return int4_linear(q, scale, zero, group_size, bias, dtype)
    raise ConfigError(f"quantization scheme {quantization!r} is not supported; choose one of {', '.join(SCHEMES)}",
                      param="quantization")


def int4_linear(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int,
                bias: torch.Tensor | None, compute_dtype: torch.dtype,
                factors: tuple[GroupValues, GroupValues | None] | None = None) -> QuantLinear:
    """Stored int4 integers (q uint8 [N, K] in 0..15, w = (q - 8) * scale + zero per group) as a layer; `factors`
    (the file's own d and m: Int4Blocks) are what the native kernels hold where given."""
    if native_supported(compute_dtype, q.shape[1], group_size):
        if factors is not None:
            return NativeInt4Linear(q, *factors, group_size, bias)
        return NativeInt4Linear.from_q(q, scale, zero, group_size, bias)
    return Int4Linear(q, scale, zero, group_size, bias, compute_dtype)


def offset_linear(blocks: OffsetBlocks, bias: torch.Tensor | None, compute_dtype: torch.dtype) -> QuantLinear | None:
    """GGUF Q5_0 / Q6_K values as a layer: on the native kernels as stored; else Q5_0 as the int8 layer of the same
    values, and None for Q6_K (its groups of 16 suit no PyTorch layer: the caller dequantizes it)."""
    group_size = blocks.q.shape[1] // blocks.scale.shape[1]
    if native_supported(compute_dtype, blocks.q.shape[1], group_size):
        scale = blocks.scale if blocks.factors is None else blocks.factors
        return NativeInt4Linear(blocks.q, scale, None, group_size, bias, blocks.bits)
    if blocks.bits != 5:
        return None
    as_int8 = blocks.as_int8()
    return int8_linear(as_int8.q, as_int8.scale, bias, compute_dtype)


def int8_linear(q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                compute_dtype: torch.dtype) -> QuantLinear:
    """Stored int8 integers as a layer: scale [N] per output channel, or [N, K/group] per group of a multiple of 32."""
    group_size = q.shape[1] if scale.dim() == 1 else q.shape[1] // scale.shape[1]
    if native_supported(compute_dtype, q.shape[1], group_size):
        return NativeInt8Linear(q, scale.reshape(q.shape[0], -1), bias)
    if scale.dim() == 1:
        return Int8Linear(q, scale, bias, compute_dtype)
    # Wider groups (compressed-tensors' W8A16 takes 64-256) as that many blocks of 32 under one scale: exact.
    return GroupInt8Linear(q, scale.repeat_interleave(group_size // GROUP_INT8_BLOCK, dim=1), bias, compute_dtype)


def w8a8_linear(q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, compute_dtype: torch.dtype,
                smooth: torch.Tensor | None = None) -> QuantLinear:
    """W8A8 from stored integers: q int8 [N, K] (the smoothed weight), scale [N]."""
    if native_supported(compute_dtype, q.shape[1], q.shape[1]):
        return NativeW8A8Linear(q, scale.float(), bias, smooth)
    return W8A8Linear(q, scale, bias, compute_dtype, smooth)


def w8a8_from_float(weight: torch.Tensor, bias: torch.Tensor | None, compute_dtype: torch.dtype, *,
                    smooth: torch.Tensor | None = None, smoothing_folded: bool = False) -> QuantLinear:
    """W8A8 rounded here; `smooth` s [K] from tally.quantize.smooth.smooth_scales multiplies the weight, and the
    layer divides its activations by s unless the 1/s was folded into the preceding norm."""
    w = weight.float() if smooth is None else weight.float() * smooth.float()[None, :]
    q, scale = quantize_int8_per_channel(w, scale_dtype=compute_dtype)
    return w8a8_linear(q, scale, bias, compute_dtype, None if smoothing_folded else smooth)


def linear_from_gguf(raw: Any, bias: torch.Tensor | None, *, compute_dtype: torch.dtype) -> nn.Module | None:
    """A layer holding a GGUF tensor's blocks exactly (tally/quant/gguf_blocks.py), or None for block types that
    are not adopted here (the caller dequantizes those)."""
    return linear_from_blocks(read_blocks(raw), bias, compute_dtype=compute_dtype)


def linear_from_blocks(blocks: Blocks | None, bias: torch.Tensor | None, *,
                       compute_dtype: torch.dtype) -> nn.Module | None:
    if blocks is None:
        return None
    if isinstance(blocks, Int4Blocks):
        group = blocks.q.shape[1] // blocks.scale.shape[1]
        native = native_supported(compute_dtype, blocks.q.shape[1], group)
        if not native and (blocks.bits != 4 or group not in INT4_GROUP_SIZES):
            return None  # 5-bit values with minima, groups of 16 (Q5_1, Q5_K; Q2_K, Q3_K): no PyTorch layer takes them
        if blocks.bits == 5:
            d, m = blocks.factors or (blocks.scale, blocks.zero - 8.0 * blocks.scale)  # a rank's slice: values
            return NativeInt4Linear(blocks.q, d, m, group, bias, bits=5)
        return int4_linear(blocks.q, blocks.scale, blocks.zero, group, bias, compute_dtype, blocks.factors)
    if isinstance(blocks, OffsetBlocks):
        return offset_linear(blocks, bias, compute_dtype)
    if isinstance(blocks, TableBlocks):
        if native_supported(compute_dtype, blocks.q.shape[1], 32):
            return NativeTableLinear(blocks.q, blocks.scale, blocks.table, bias)
        blocks = blocks.as_int8()  # PyTorch's layers take the values
    return int8_linear(blocks.q, blocks.scale, bias, compute_dtype)


def _check_group_size(in_features: int, group_size: int) -> None:
    if group_size not in INT4_GROUP_SIZES:
        raise ConfigError(f"int4 group size {group_size} is not supported; choose 32, 64 or 128", param="group_size")
    if in_features % group_size:
        fits = [g for g in INT4_GROUP_SIZES if in_features % g == 0]
        instead = f"choose group size {' or '.join(map(str, fits))}" if fits else "use int8 for this model"
        raise ConfigError(f"int4 group size {group_size} does not divide this layer's {in_features} input features; "
                          f"{instead}", param="group_size")
