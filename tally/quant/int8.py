"""Weight-only int8, symmetric per output channel: y = (x @ q^T) * scale.

Holds q int8 [N, K] and scale [N] in the compute dtype (the CPU kernel wants the scale in the activation dtype):
1 byte per weight. Few tokens: `torch._weight_int8pack_mm`. Many tokens: q is converted to the matmul dtype
(see dispatch.py) tile by tile for a dense matmul and the per-channel scale is applied to the output — the same
arithmetic, so both paths agree to rounding; the converted tile lives only for the call.
"""
from __future__ import annotations

import torch

from tally.quant.base import QuantLinear
from tally.quant.dispatch import many_tokens_from


def int8pack_supports(in_features: int) -> bool:
    # `_weight_int8pack_mm` on CPU reads K in steps of 4 and crashes the process otherwise (torch 2.13).
    return in_features % 4 == 0


class Int8Linear(QuantLinear):
    scheme = "int8"

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                 compute_dtype: torch.dtype) -> None:
        out_features, in_features = q.shape
        threshold = many_tokens_from(self.scheme, compute_dtype) if int8pack_supports(in_features) else 1
        super().__init__(in_features, out_features, bias, compute_dtype, threshold)
        self.register_buffer("weight_int8", q.to(torch.int8).contiguous())
        self.register_buffer("scale", scale.to(compute_dtype).contiguous())

    def _few_tokens(self, x: torch.Tensor) -> torch.Tensor:
        return torch._weight_int8pack_mm(x, self.weight_int8, self.scale)

    def _many_tokens(self, x: torch.Tensor) -> torch.Tensor:
        dtype = self.matmul_dtype
        y = self._tiled_matmul(x, dtype, lambda n0, n1: self.weight_int8[n0:n1].to(dtype).t())
        return y.mul_(self.scale).to(self.compute_dtype)
