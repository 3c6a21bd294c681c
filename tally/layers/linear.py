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


def build_linear(weight: torch.Tensor, bias: torch.Tensor | None, *, quantization: str | None,
                 dtype: torch.dtype) -> nn.Module:
    if quantization in (None, "none"):
        return DenseLinear(weight, bias, dtype)
    from tally.quant.linear import make_linear

    return make_linear(weight, bias, scheme=quantization, compute_dtype=dtype)
