"""int8 with one scale per block of 32 input channels (GGUF Q8_0): w[n, k] = d[n, k // 32] * q[n, k].

Kept exactly as stored — no requantization — at 1 + 4/32 bytes per weight (scales in the compute dtype; in bf16
that rounds the fp16 block scales to 8 mantissa bits, the precision bf16 compute has anyway; in fp32 exact).
Few tokens: the weight-only int8 kernel once per block column, each with that column's scales as its per-channel
scales, partial sums added in fp32 (K/32 kernel calls; q is stored block-major so each call reads contiguous
bytes). Many tokens: dequantize to the matmul dtype (dispatch.py) tile by tile for a dense matmul; a tile lives only
for the call.
"""
from __future__ import annotations

import torch

from tally.quant.base import QuantLinear
from tally.quant.dispatch import many_tokens_from

BLOCK = 32


class GroupInt8Linear(QuantLinear):
    scheme = "q8_0"

    def __init__(self, q: torch.Tensor, block_scale: torch.Tensor, bias: torch.Tensor | None,
                 compute_dtype: torch.dtype) -> None:
        """q int8 [N, K]; block_scale [N, K/32]."""
        out_features, in_features = q.shape
        super().__init__(in_features, out_features, bias, compute_dtype, many_tokens_from(self.scheme, compute_dtype))
        blocks = in_features // BLOCK
        self.register_buffer("q_blocks", q.to(torch.int8).reshape(out_features, blocks, BLOCK).transpose(0, 1)
                             .contiguous())  # [K/32, N, 32]
        self.register_buffer("block_scale", block_scale.t().to(compute_dtype).contiguous())  # [K/32, N]

    def _few_tokens(self, x: torch.Tensor) -> torch.Tensor:
        x_blocks = x.view(x.shape[0], -1, BLOCK).transpose(0, 1).contiguous()  # [K/32, M, 32]
        acc = torch.zeros(x.shape[0], self.out_features, dtype=torch.float32, device=x.device)
        for b in range(x_blocks.shape[0]):
            acc.add_(torch._weight_int8pack_mm(x_blocks[b], self.q_blocks[b], self.block_scale[b]))
        return acc.to(self.compute_dtype)

    def _many_tokens(self, x: torch.Tensor) -> torch.Tensor:
        dtype = self.matmul_dtype
        return self._tiled_matmul(x, dtype, lambda n0, n1: self._dequantized_t(n0, n1, dtype)).to(self.compute_dtype)

    def _dequantized_t(self, n0: int, n1: int, dtype: torch.dtype) -> torch.Tensor:
        w = torch.empty(n1 - n0, self.in_features // BLOCK, BLOCK, dtype=dtype, device=self.q_blocks.device)
        w.copy_(self.q_blocks[:, n0:n1].transpose(0, 1))
        w.mul_(self.block_scale[:, n0:n1].t()[..., None])
        return w.view(n1 - n0, self.in_features).t()
