"""The factory the model code builds every projection through."""
from __future__ import annotations

import torch
from torch import nn

from tally.errors import ConfigError
from tally.quant.gguf_blocks import linear_from_gguf
from tally.quant.native_linear import int4_linear, int8_linear
from tally.quant.rtn import quantize_int4_groupwise, quantize_int8_per_channel
from tally.quant.w8a8 import w8a8_from_float

SCHEMES = ("none", "int8", "int4", "w8a8")
INT4_GROUP_SIZES = (32, 64, 128)

__all__ = ["SCHEMES", "INT4_GROUP_SIZES", "make_linear", "linear_from_gguf"]


def _check_group_size(in_features: int, group_size: int) -> None:
    if group_size not in INT4_GROUP_SIZES:
        raise ConfigError(f"int4 group size {group_size} is not supported; choose 32, 64 or 128", param="group_size")
    if in_features % group_size:
        fits = [g for g in INT4_GROUP_SIZES if in_features % g == 0]
        instead = f"choose group size {' or '.join(map(str, fits))}" if fits else "use int8 for this model"
        raise ConfigError(f"int4 group size {group_size} does not divide this layer's {in_features} input features; "
                          f"{instead}", param="group_size")


def make_linear(weight: torch.Tensor, bias: torch.Tensor | None, *, scheme: str, compute_dtype: torch.dtype,
                group_size: int = 128) -> nn.Module:
    """weight [out, in] (HF layout) -> a module mapping [..., in] to [..., out] in compute_dtype.
    "w8a8" here is unsmoothed; for SmoothQuant call w8a8.w8a8_from_float(..., smooth=s) directly."""
    if scheme == "none":
        from tally.layers.linear import DenseLinear  # layers sit above quant; imported late to keep that order

        return DenseLinear(weight, bias, compute_dtype)
    if scheme == "int8":
        q, scale = quantize_int8_per_channel(weight, scale_dtype=compute_dtype)
        return int8_linear(q, scale, bias, compute_dtype)
    if scheme == "w8a8":
        return w8a8_from_float(weight, bias, compute_dtype)
    if scheme == "int4":
        _check_group_size(weight.shape[1], group_size)
        q, scale, zero = quantize_int4_groupwise(weight, group_size, scale_dtype=compute_dtype)
        return int4_linear(q, scale, zero, group_size, bias, compute_dtype)
    raise ConfigError(f"quantization scheme {scheme!r} is not supported; choose one of {', '.join(SCHEMES)}",
                      param="quantization")
