"""RMSNorm, computed in float32 like Hugging Face's reference: the PyTorch path matches it bit for bit, the native
kernel (fp32 models on AVX2 CPUs) differs only in the order of the sum of squares."""
from __future__ import annotations

import torch
from torch import nn

from tally.native import ops as native


class RMSNorm(nn.Module):
    def __init__(self, weight: torch.Tensor, eps: float, dtype: torch.dtype | None = None,
                 scale_in_float: bool = False) -> None:
        """`scale_in_float`: the weight stays float32 and multiplies before the cast back (Gemma, OLMo 2), not
        after it (Llama)."""
        super().__init__()
        self.scale_in_float = scale_in_float
        dtype = torch.float32 if scale_in_float else dtype
        self.weight = nn.Parameter(weight if dtype is None else weight.to(dtype), requires_grad=False)
        self.eps = eps
        # the native kernel: one call instead of torch.rms_norm's five ops (fp32 only)
        self.native = self.weight.dtype == torch.float32 and native.vector_supported(weight.shape[-1]) \
            and native.available()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # torch.rms_norm is x * rsqrt(mean(x^2) + eps) [* weight] in one call: 61 norms per step, each op saved
        # is Python and dispatch time saved. In fp32 the weight goes in too (same result, no cast to undo);
        # otherwise it multiplies after the cast back, as in Hugging Face's LlamaRMSNorm.
        if self.native and x.dtype == torch.float32 and x.is_contiguous():
            return native.rms_norm(x, self.weight, self.eps)
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return torch.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        if self.scale_in_float:
            return torch.rms_norm(x.float(), (x.shape[-1],), self.weight, self.eps).to(x.dtype)
        normed = torch.rms_norm(x.float(), (x.shape[-1],), None, self.eps)
        return self.weight * normed.to(x.dtype)
