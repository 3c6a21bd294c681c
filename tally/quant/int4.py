"""Weight-only int4, asymmetric per group of 32/64/128 input channels: w = (q - 8) * scale + zero.

Holds the kernel-packed weight (0.5 byte per weight) and scales_and_zeros [K/group, N, 2] in the compute dtype
(the kernel wants them in the activation dtype): 0.5 + 4/group bytes per weight. Rows are padded to the kernel's
block (zero scale and zero, sliced off) when out_features is not a multiple of it.

Few tokens: `torch._weight_int4pack_mm_for_cpu`. Many tokens: the packed bytes are unpacked and dequantized to the
matmul dtype (dispatch.py) tile by tile for a dense matmul; a tile lives only for the call.
"""
from __future__ import annotations

import torch

from tally.quant import int4pack
from tally.quant.base import QuantLinear
from tally.quant.dispatch import NEVER, many_tokens_from


class Int4Linear(QuantLinear):
    scheme = "int4"

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int,
                 bias: torch.Tensor | None, compute_dtype: torch.dtype) -> None:
        """q uint8 [N, K] in 0..15; scale, zero [N, K/group_size] (any float dtype; rounded to compute_dtype)."""
        out_features, in_features = q.shape
        block_n = int4pack.kernel_block_n()  # None: the many-token path cannot read the packed layout
        threshold = many_tokens_from(self.scheme, compute_dtype) if block_n else NEVER
        super().__init__(in_features, out_features, bias, compute_dtype, threshold)
        self.block_n = block_n
        self.group_size = group_size
        n_padded = int4pack.padded_out_features(out_features)
        pad = n_padded - out_features
        if pad:
            q = torch.cat([q, q.new_full((pad, in_features), 8)])
            scale = torch.cat([scale, scale.new_zeros(pad, scale.shape[1])])
            zero = torch.cat([zero, zero.new_zeros(pad, zero.shape[1])])
        self.register_buffer("packed", int4pack.pack(q))
        sz = torch.stack([scale.t(), zero.t()], dim=-1).to(compute_dtype).contiguous()
        self.register_buffer("scales_and_zeros", sz)

    def _trim(self, y: torch.Tensor) -> torch.Tensor:
        return y if y.shape[1] == self.out_features else y[:, :self.out_features]

    def _few_tokens(self, x: torch.Tensor) -> torch.Tensor:
        y = torch._weight_int4pack_mm_for_cpu(x, self.packed, self.group_size, self.scales_and_zeros)
        return self._trim(y)

    def _many_tokens(self, x: torch.Tensor) -> torch.Tensor:
        dtype = self.matmul_dtype
        y = self._tiled_matmul(x, dtype, lambda n0, n1: self._dequantized_t(n0, n1, dtype), align=self.block_n)
        return self._trim(y.to(self.compute_dtype))

    def _dequantized_t(self, n0: int, n1: int, dtype: torch.dtype) -> torch.Tensor:
        """W^T [K, n1 - n0] in `dtype` for rows n0..n1 (whole kernel blocks) of the padded weight."""
        groups, rows = self.in_features // self.group_size, n1 - n0
        w_t = int4pack.unpack_transposed(self.packed[n0:n1], rows, self.block_n, dtype)  # q as [K, NB, BN]
        grouped = w_t.view(groups, self.group_size, rows)
        scale = self.scales_and_zeros[:, n0:n1, 0].float()
        # (q - 8) * scale + zero == q * scale + (zero - 8 * scale); the fold is done in fp32, rounded once.
        offset = (self.scales_and_zeros[:, n0:n1, 1].float() - 8.0 * scale).to(dtype)
        # Contiguous [G, 1, rows] operands keep the one pass over the tile vectorised along its rows.
        torch.addcmul(offset[:, None, :], grouped, scale.to(dtype).contiguous()[:, None, :], out=grouped)
        return w_t.view(self.in_features, rows)
