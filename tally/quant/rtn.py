"""Round-to-nearest quantizers and their exact dequantizers (the reference every quantized layer is tested against).

Scales are rounded to the dtype the kernel will hold them in *before* the integers are chosen, so the integers
are the best ones for the scale the kernel actually multiplies by.
"""
from __future__ import annotations

import torch

_MIN_SCALE = 1e-10  # keeps all-zero rows/groups finite; their integers come out 0 (int8) or 8 (int4) either way


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round to `dtype`, keep computing in fp32."""
    return t.to(dtype).float()


def quantize_int8_per_channel(w: torch.Tensor, *, scale_dtype: torch.dtype = torch.float32
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8: w[n, k] ≈ q[n, k] * scale[n]. Returns (q int8 [N, K], scale [N])."""
    w32 = w.float()
    scale = _as((w32.abs().amax(dim=1) / 127.0).clamp(min=_MIN_SCALE), scale_dtype)
    q = torch.round(w32 / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale.to(scale_dtype)


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale.float()[:, None]


def quantize_int4_groupwise(w: torch.Tensor, group_size: int, *, scale_dtype: torch.dtype = torch.float32
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric min/max int4 per group of `group_size` input channels, in the int4pack kernel's convention
    w ≈ (q - 8) * scale + zero. Returns (q uint8 [N, K] in 0..15, scale [N, K/group], zero [N, K/group])."""
    n, k = w.shape
    wg = w.float().reshape(n, k // group_size, group_size)
    lo, hi = wg.amin(dim=-1), wg.amax(dim=-1)
    scale = _as(((hi - lo) / 15.0).clamp(min=_MIN_SCALE), scale_dtype)
    zero = _as(lo + 8.0 * scale, scale_dtype)
    q = torch.round((wg - zero[..., None]) / scale[..., None] + 8.0).clamp_(0, 15).to(torch.uint8)
    return q.reshape(n, k), scale.to(scale_dtype), zero.to(scale_dtype)


def dequantize_int4(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int) -> torch.Tensor:
    n, k = q.shape
    qg = q.float().reshape(n, k // group_size, group_size)
    return ((qg - 8.0) * scale.float()[..., None] + zero.float()[..., None]).reshape(n, k)
