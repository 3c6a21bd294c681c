"""int4 and int8 layers on Tally's own CPU kernels (tally/native), for fp32 compute.

PyTorch's CPU weight-only kernels want bf16 activations and are slow reference paths with fp32 ones; on a CPU
without bf16 instructions that left int4 slower than fp16 weights. These layers keep the weights in the native
kernels' layouts and serve few-token batches with them (int8 activations per block of 32, integer dot products,
as llama.cpp does); many-token batches dequantize the weights tile by tile into an fp32 matmul. Both paths
multiply the same int8-rounded activations, so a token's result does not depend on the size of its batch (up to
the order of fp32 sums, as with any two matmul kernels).

int4: qs uint8 [N, K/2] in GGUF's nibble order (byte j of each 32-block holds weights j and j + 16), so Q4_0 /
Q4_1 blocks are adopted as stored; d, m fp32 [N, K/group] with w = q * d + m. int8: q [N, K], s fp32 [N, K/group]
(group = K: one scale per output channel; 32: GGUF Q8_0).
"""
from __future__ import annotations

import torch

from tally.native import ops
from tally.quant.base import QuantLinear

# First row count on the dequantize-and-matmul path: the kernels convert their weights again for every
# activation row, so one dense fp32 matmul wins from some rows on. `python bench/weight_formats.py --model smol
# --threads 1 --rows 1,2,3,4,6,8,16,32,128` (all SmolLM2 projections, ms per pass, kernel vs dequantize+matmul):
# int8 1 row 12.8 vs 48.2, 32 rows 177 vs 220, 128 rows 787 vs 630; int4 9.3 vs 173, 225 vs 304, 1113 vs 760.
# The crossover lies between 32 and 128 rows for both; 64 is its geometric middle.
MANY_TOKENS_FROM = {"int4": 64, "int8": 64}


def native_supported(compute_dtype: torch.dtype, in_features: int, group_size: int) -> bool:
    return compute_dtype == torch.float32 and ops.available() and ops.integer_gemm_supported(in_features, group_size)


class NativeInt4Linear(QuantLinear):
    scheme = "int4"

    def __init__(self, qs: torch.Tensor, d: torch.Tensor, m: torch.Tensor, group_size: int,
                 bias: torch.Tensor | None) -> None:
        out_features, in_features = qs.shape[0], qs.shape[1] * 2
        super().__init__(in_features, out_features, bias, torch.float32, MANY_TOKENS_FROM["int4"])
        self.group_size = group_size
        self.register_buffer("qs", qs.contiguous())
        self.register_buffer("d", d.float().contiguous())
        self.register_buffer("m", m.float().contiguous())

    @classmethod
    def from_q(cls, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int,
               bias: torch.Tensor | None) -> NativeInt4Linear:
        """Int4Linear's convention: q uint8 [N, K] in 0..15, w = (q - 8) * scale + zero per group."""
        n, k = q.shape
        halves = q.to(torch.uint8).view(n, k // 32, 2, 16)
        qs = (halves[:, :, 0] | (halves[:, :, 1] << 4)).reshape(n, k // 2)
        scale = scale.float()
        return cls(qs, scale, zero.float() - 8.0 * scale, group_size, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The decode step's common case goes straight to the kernel (bias fused): QuantLinear.forward's reshapes
        # and checks cost more than the kernel's own call on a small layer.
        if x.dim() == 2 and x.shape[0] < self.many_tokens_from and x.dtype == torch.float32 and x.is_contiguous():
            return ops.gemm_q4(x, self.qs, self.d, self.m, self.bias, self.group_size)
        return super().forward(x)

    def _few_tokens(self, x: torch.Tensor) -> torch.Tensor:
        return ops.gemm_q4(x, self.qs, self.d, self.m, None, self.group_size)

    def _many_tokens(self, x: torch.Tensor) -> torch.Tensor:
        return self._tiled_matmul(ops.int8_roundtrip(x), torch.float32, self._dequantized_t)

    def _dequantized_t(self, n0: int, n1: int) -> torch.Tensor:
        qs = self.qs[n0:n1].view(n1 - n0, -1, 16)
        w = torch.cat([qs & 15, qs >> 4], dim=-1).view(n1 - n0, -1, self.group_size).float()
        w.mul_(self.d[n0:n1, :, None]).add_(self.m[n0:n1, :, None])
        return w.view(n1 - n0, self.in_features).t()


class NativeInt8Linear(QuantLinear):
    def __init__(self, q: torch.Tensor, s: torch.Tensor, bias: torch.Tensor | None) -> None:
        """q int8 [N, K]; s [N, K/group] (one column: per output channel)."""
        out_features, in_features = q.shape
        super().__init__(in_features, out_features, bias, torch.float32, MANY_TOKENS_FROM["int8"])
        self.scheme = "int8" if s.shape[1] == 1 else "q8_0"
        self.group_size = in_features // s.shape[1]
        self.register_buffer("q", q.to(torch.int8).contiguous())
        self.register_buffer("s", s.float().contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and x.shape[0] < self.many_tokens_from and x.dtype == torch.float32 and x.is_contiguous():
            return ops.gemm_q8(x, self.q, self.s, self.bias, self.group_size)  # as NativeInt4Linear.forward
        return super().forward(x)

    def _few_tokens(self, x: torch.Tensor) -> torch.Tensor:
        return ops.gemm_q8(x, self.q, self.s, None, self.group_size)

    def embedding_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of the dequantized weight, fp32 [len(ids), K]: a tied embedding read from an int8 LM head."""
        rows = self.q[ids].view(len(ids), -1, self.group_size).float()
        return rows.mul_(self.s[ids][:, :, None]).view(len(ids), self.in_features)

    def _many_tokens(self, x: torch.Tensor) -> torch.Tensor:
        return self._tiled_matmul(ops.int8_roundtrip(x), torch.float32, self._dequantized_t)

    def _dequantized_t(self, n0: int, n1: int) -> torch.Tensor:
        w = self.q[n0:n1].view(n1 - n0, -1, self.group_size).float().mul_(self.s[n0:n1, :, None])
        return w.view(n1 - n0, self.in_features).t()


def int4_linear(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int,
                bias: torch.Tensor | None, compute_dtype: torch.dtype) -> QuantLinear:
    """The int4 layer for this compute dtype and CPU (Int4Linear's convention, w = (q - 8) * scale + zero)."""
    if native_supported(compute_dtype, q.shape[1], group_size):
        return NativeInt4Linear.from_q(q, scale, zero, group_size, bias)
    from tally.quant.int4 import Int4Linear

    return Int4Linear(q, scale, zero, group_size, bias, compute_dtype)


def int8_linear(q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                compute_dtype: torch.dtype) -> QuantLinear:
    """The int8 layer for this compute dtype and CPU: scale [N] per output channel, or [N, K/32] per block."""
    group_size = q.shape[1] if scale.dim() == 1 else q.shape[1] // scale.shape[1]
    if native_supported(compute_dtype, q.shape[1], group_size):
        return NativeInt8Linear(q, scale.reshape(q.shape[0], -1), bias)
    if scale.dim() == 1:
        from tally.quant.int8 import Int8Linear

        return Int8Linear(q, scale, bias, compute_dtype)
    from tally.quant.group_int8 import GroupInt8Linear

    return GroupInt8Linear(q, scale, bias, compute_dtype)
