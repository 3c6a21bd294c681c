"""The one place a projection is built: dense here, quantized schemes in tally/quant."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class DenseLinear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.to(dtype), requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.to(dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class ConcatLinear(nn.Module):
    """Several projections of the same input, outputs side by side: a fused projection whose parts are stored
    differently (e.g. a GGUF with q/k in Q4_1 and v in Q8_0), so the model code still sees one module."""

    def __init__(self, parts: list[nn.Module]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([part(x) for part in self.parts], dim=-1)


def build_linear(weight: torch.Tensor, bias: torch.Tensor | None, *, quantization: str | None,
                 dtype: torch.dtype) -> nn.Module:
    if quantization in (None, "none"):
        return DenseLinear(weight, bias, dtype)
    from tally.quant.linear import make_linear

    # The largest int4 group that divides the layer (128 for real models; tiny test models need less).
    in_features = weight.shape[1]
    group_size = next((g for g in (128, 64, 32) if in_features % g == 0), 128)
    return make_linear(weight, bias, scheme=quantization, compute_dtype=dtype, group_size=group_size)
