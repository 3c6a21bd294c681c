"""What every quantized projection shares: [..., in] -> [..., out] in the compute dtype, bias, and the choice
between a few-token kernel (weight-only, bandwidth-bound decode) and a many-token kernel (compute-bound prefill)."""
from __future__ import annotations

import torch
from torch import nn


class QuantLinear(nn.Module):
    """Subclasses implement `_few_tokens` and `_many_tokens` on a contiguous 2-D input in `compute_dtype`;
    both return [M, out_features] in `compute_dtype` and must agree within the scheme's own tolerance.

    `many_tokens_from` is the first row count that takes the many-token path (see tally/quant/dispatch.py);
    it is a plain attribute so tests and benchmarks can force one path."""

    def __init__(self, in_features: int, out_features: int, bias: torch.Tensor | None,
                 compute_dtype: torch.dtype, many_tokens_from: int) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.compute_dtype = compute_dtype
        self.many_tokens_from = many_tokens_from
        self.register_buffer("bias", None if bias is None else bias.detach().to(compute_dtype).contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).to(self.compute_dtype).contiguous()
        if x2.shape[0] >= self.many_tokens_from:
            y = self._many_tokens(x2)
        else:
            y = self._few_tokens(x2)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features)

    def _few_tokens(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _many_tokens(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def weight_nbytes(self) -> int:
        """Bytes this layer holds for its weight (bias excluded): what the memory ledger should charge."""
        return sum(b.numel() * b.element_size() for name, b in self.named_buffers() if name != "bias")

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"compute_dtype={self.compute_dtype}, many_tokens_from={self.many_tokens_from}")
