"""W8A8: int8 per-channel weights and per-token dynamic int8 activations, multiplied by `torch._int_mm`.

Optionally SmoothQuant-smoothed: the weight holds W·s and the activations must arrive divided by s. When the
1/s has been folded into the preceding RMSNorm (tally.quantize.smooth.fold_smoothing_into_norm) the layer is built
with `smoothing_folded=True`; otherwise it divides by s itself (one extra elementwise op per call, K floats kept).

Few tokens take the weight-only int8 kernel on the same int8 weight (faster there, and no activation rounding);
many tokens take `_int_mm` (or its fp32 equivalent where the CPU has no VNNI). Memory: 1 byte per weight plus
two [N] scale vectors (compute dtype, fp32). With fp32 compute where Tally's native kernels build, the factory
(tally/layers/linear.py) gives `NativeW8A8Linear` instead: the same integers on the int8 byte-dot-product kernel,
for every batch size.
"""
from __future__ import annotations

import torch

from tally.platform import has_fast_int8_matmul
from tally.quant.int8 import Int8Linear

_MIN_ACT_SCALE = 1e-8


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per row: x ≈ q * scale. Returns (q int8 [M, K], scale fp32 [M, 1])."""
    x32 = x.float()
    scale = x32.abs().amax(dim=-1, keepdim=True).div_(127.0).clamp_(min=_MIN_ACT_SCALE)
    return (x32 / scale).round_().clamp_(-127, 127).to(torch.int8), scale  # never in place: x32 may be x


class W8A8Linear(Int8Linear):
    scheme = "w8a8"

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                 compute_dtype: torch.dtype, smooth: torch.Tensor | None = None) -> None:
        super().__init__(q, scale, bias, compute_dtype)
        self.register_buffer("scale_fp32", scale.float().reshape(1, -1).contiguous())
        self.use_int_mm = has_fast_int8_matmul()
        self.register_buffer("act_inv_smooth", None if smooth is None else (1.0 / smooth.float()).to(compute_dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.act_inv_smooth is not None:
            x = x * self.act_inv_smooth
        return super().forward(x)

    def _many_tokens(self, x: torch.Tensor) -> torch.Tensor:
        xq, act_scale = quantize_per_token(x)
        if self.use_int_mm:
            acc = torch._int_mm(xq, self.weight_int8.t()).float()
        else:  # the same integer products in fp32: exact up to fp32's 24-bit sums
            acc = self._tiled_matmul(xq, torch.float32, lambda n0, n1: self.weight_int8[n0:n1].float().t())
        return acc.mul_(act_scale).mul_(self.scale_fp32).to(self.compute_dtype)

