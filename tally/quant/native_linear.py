"""int4 and int8 layers on Tally's own CPU kernels (tally/native), for fp32 compute, where PyTorch's weight-only
kernels are slow reference paths. The weights stay in the kernels' layouts and meet int8 activations per block of 32
(integer dot products, as llama.cpp does). One kernel serves every batch size, faster than dequantizing into an fp32
matmul at every row count (docs/benchmarks.md#paths-chosen-by-measurement), so a token's bits do not depend on its
batch (unless the start-up measurement sends many rows on to a bf16 matmul: `use_many_tokens`).
"""
from __future__ import annotations

import torch

from tally.native import ops
from tally.quant.base import BF16_TILE_BYTES, QuantLinear, tiled_matmul
from tally.quant.dispatch import NEVER
from tally.quant.gguf_blocks import SuperBlockValues

# Weights are held in the kernels' tiles of 8 outputs (tally/native/ops.py: pack_q4, pack_planes, pack_q8,
# pack_tile_scales): int4 qs uint8 [T, K/8, 32] with d, m [T, G, 8] (w = q * d + m per group; GGUF Q4_0 without m:
# w = d * (q - 8)); GGUF's Q5_0 and Q6_K as the same nibbles plus planes of high bits qh [T, K/32, 32 per bit] with d
# (w = d * (q - 16), groups of 32; w = d * (q - 32), groups of 16: no m);
# int8 q [T, K/4, 32] with s [T, G, 8] (group = K: one scale per output channel; 32: GGUF Q8_0). Loading GGUF
# Q4_0/Q4_1/Q4_K/Q5_0/Q6_K/Q8_0 blocks into them only rearranges the stored integers. Scales and minima are held in
# the smallest form that keeps them exactly (int_dots.h: GroupValues): Q4_K's and Q6_K's as the file factors them (an
# fp16 base per super-block times int8 steps, ops.pack_tile_factors); else fp16 where every value of the layer is one
# (GGUF's own d and m are); else fp32 (RTN's). The same floats in the kernels, fewer bytes for a decode to stream.
GroupValues = torch.Tensor | SuperBlockValues


def native_supported(compute_dtype: torch.dtype, in_features: int, group_size: int) -> bool:
    return compute_dtype == torch.float32 and ops.available() and ops.integer_gemm_supported(in_features, group_size)


def _packed_values(*values: GroupValues | None) -> list[torch.Tensor | None]:
    """A layer's per-group values [N, G] (scales, and minima or None) in the kernels' tile order and the smallest
    form that holds all of them exactly: factored as given, else fp16, else fp32."""
    if all(isinstance(v, SuperBlockValues) for v in values if v is not None):
        return [None if v is None else ops.pack_tile_factors(v.base, v.steps) for v in values]
    values = tuple(v.values() if isinstance(v, SuperBlockValues) else v for v in values)
    half = ops.fits_half(*(v for v in values if v is not None))
    return [None if v is None else ops.pack_tile_scales(v, half) for v in values]


def _dequantized_matmul(layer: NativeInt4Linear | NativeInt8Linear, x: torch.Tensor) -> torch.Tensor:
    """The many-token path (off unless `use_many_tokens` was called): runs of whole 8-output weight tiles
    dequantized into a bf16 matmul (tally/native/kernels.c); fp32 out, as the kernel's."""
    y = tiled_matmul(x, layer.out_features, torch.bfloat16, layer._weight_t, ops.TILE, BF16_TILE_BYTES)
    return y[:, :layer.out_features].float()


def _takes_kernel(layer: QuantLinear, x: torch.Tensor) -> bool:
    """Whether x goes straight to the integer kernel: fp32 rows as the kernel reads them, fewer than the many-token
    path takes."""
    return x.dim() == 2 and x.dtype == torch.float32 and x.is_contiguous() and x.shape[0] < layer.many_tokens_from


def _rows_of(x: torch.Tensor, in_features: int) -> torch.Tensor:
    """x as the kernels take it: fp32 rows [M, K], contiguous."""
    return x.reshape(-1, in_features).float().contiguous()


def _first(bias: torch.Tensor | None, n: int) -> torch.Tensor | None:
    return None if bias is None else bias[:n]


class NativeInt4Linear(QuantLinear):
    """Nibbles per weight: int4 (w = q * d + m), or without minima w = d * (q - 2**(bits-1)): GGUF's Q4_0, and with
    high bits its Q5_0 / Q6_K."""

    def __init__(self, q: torch.Tensor, d: GroupValues, m: GroupValues | None, group_size: int,
                 bias: torch.Tensor | None, bits: int = 4) -> None:
        """q uint8 [N, K] below 2**bits (4, 5 or 6); d, m [N, K/group] (or their K-quant factors): w = q * d + m; m
        None (bits 5 and 6 always): w = d * (q - 2**(bits - 1)), the offset the kernels take off in integers."""
        out_features, in_features = q.shape
        super().__init__(in_features, out_features, bias, torch.float32, NEVER)
        self.group_size = group_size
        self.scheme = {4: "int4", 5: "q5_0", 6: "q6_k"}[bits]
        qs, qh = (ops.pack_q4(q), None) if bits == 4 else ops.pack_planes(q, bits)
        self.register_buffer("qs", qs)
        self.register_buffer("qh", qh)
        self.bits = bits
        d, m = _packed_values(d, m)
        self.register_buffer("d", d)
        self.register_buffer("m", m)

    @classmethod
    def from_q(cls, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int,
               bias: torch.Tensor | None) -> NativeInt4Linear:
        """Int4Linear's convention: q uint8 [N, K] in 0..15, w = (q - 8) * scale + zero per group. Zero everywhere
        (GGUF Q4_0, symmetric): no minima held, 0.5 bits a weight less to store and for a decode to stream."""
        scale = scale.float()
        return cls(q, scale, None if not zero.any() else zero.float() - 8.0 * scale, group_size, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The common case goes straight to the kernel (bias fused): QuantLinear.forward's reshapes and checks cost
        # more than the kernel's own call on a small layer.
        if _takes_kernel(self, x):
            return ops.gemm_q4(x, self.qs, self.d, self.m, self.bias, self.group_size, self.out_features, qh=self.qh)
        return super().forward(x)

    def add_to(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The kernel adds its product to `out` as it stores it, as the one-call decode step's residual does."""
        if _takes_kernel(self, x) and out.is_contiguous():
            return ops.gemm_q4(x, self.qs, self.d, self.m, self.bias, self.group_size, self.out_features, out,
                               qh=self.qh)
        return super().add_to(x, out)

    def first_outputs(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """Outputs 0..n-1 from the first ceil(n / 8) tiles only: the kernel given n outputs reads no further."""
        return ops.gemm_q4(_rows_of(x, self.in_features), self.qs, self.d, self.m, _first(self.bias, n),
                           self.group_size, n, qh=self.qh).view(*x.shape[:-1], n)

    def _few_tokens(self, x: torch.Tensor) -> torch.Tensor:
        return ops.gemm_q4(x, self.qs, self.d, self.m, None, self.group_size, self.out_features, qh=self.qh)

    def _weight_t(self, n0: int, n1: int) -> torch.Tensor:
        t = slice(n0 // ops.TILE, n1 // ops.TILE)
        m, qh = (None if a is None else a[t] for a in (self.m, self.qh))
        return ops.dequant_q4_bf16(self.qs[t], self.d[t], m, self.group_size, qh=qh).t()

    def _many_tokens(self, x: torch.Tensor) -> torch.Tensor:
        return _dequantized_matmul(self, x)

    def embedding_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of the dequantized weight, fp32 [len(ids), K]: a token table read from its blocks (a tied LM head's,
        or a GGUF table's own)."""
        return ops.dequant_q4_rows(self.qs, self.d, self.m, ids, self.group_size, qh=self.qh)


class NativeTableLinear(NativeInt4Linear):
    """4-bit indices into a table of 16 int8 values, w = d * table[q] per group of 32 (GGUF IQ4_NL, IQ4_XS, MXFP4):
    the indices held as int4's nibbles, turned into the values by one byte shuffle in the kernels (int_dots.h: LUT4),
    half the bytes of the int8 values they stand for. The same integer sums and float operations as NativeInt8Linear
    over those values: the same bits."""

    def __init__(self, q: torch.Tensor, d: torch.Tensor, table: torch.Tensor, bias: torch.Tensor | None) -> None:
        """q uint8 [N, K] in 0..15; d [N, K/32]; table int8 [16]."""
        super().__init__(q, d, None, 32, bias)
        self.scheme = "lut4"
        self.bits = ops.LUT4
        self.qh = table.to(torch.int8).contiguous()  # gemm_q4's `qh`: the table, where int5 / int6 hold their planes

    def _weight_t(self, n0: int, n1: int) -> torch.Tensor:
        t = slice(n0 // ops.TILE, n1 // ops.TILE)
        return ops.dequant_q4_bf16(self.qs[t], self.d[t], None, self.group_size, qh=self.qh).t()


class NativeInt8Linear(QuantLinear):
    per_token = False  # activations int8 per block of 32; W8A8 (below) rounds them with one scale per token

    def __init__(self, q: torch.Tensor, s: torch.Tensor, bias: torch.Tensor | None) -> None:
        """q int8 [N, K]; s [N, K/group] (one column: per output channel)."""
        out_features, in_features = q.shape
        super().__init__(in_features, out_features, bias, torch.float32, NEVER)
        self.scheme = "int8" if s.shape[1] == 1 else "q8_0"
        self.group_size = in_features // s.shape[1]
        self.register_buffer("q", ops.pack_q8(q))
        self.register_buffer("s", _packed_values(s)[0])
        self.symmetric = ops.symmetric_q8(q)  # the one-row loop's condition (int_dots.h: int8_one_row_dots)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _takes_kernel(self, x):  # as NativeInt4Linear.forward
            return ops.gemm_q8(x, self.q, self.s, self.bias, self.group_size, self.out_features,
                               per_token=self.per_token, symmetric=self.symmetric)
        return super().forward(x)

    def add_to(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """As NativeInt4Linear.add_to."""
        if _takes_kernel(self, x) and out.is_contiguous():
            return ops.gemm_q8(x, self.q, self.s, self.bias, self.group_size, self.out_features, out,
                               per_token=self.per_token, symmetric=self.symmetric)
        return super().add_to(x, out)

    def first_outputs(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """As NativeInt4Linear.first_outputs."""
        return ops.gemm_q8(_rows_of(x, self.in_features), self.q, self.s, _first(self.bias, n), self.group_size, n,
                           per_token=self.per_token, symmetric=self.symmetric).view(*x.shape[:-1], n)

    def _few_tokens(self, x: torch.Tensor) -> torch.Tensor:
        return ops.gemm_q8(x, self.q, self.s, None, self.group_size, self.out_features, per_token=self.per_token,
                           symmetric=self.symmetric)

    def _weight_t(self, n0: int, n1: int) -> torch.Tensor:
        t = slice(n0 // ops.TILE, n1 // ops.TILE)
        return ops.dequant_q8_bf16(self.q[t], self.s[t], self.group_size).t()

    def _many_tokens(self, x: torch.Tensor) -> torch.Tensor:
        return _dequantized_matmul(self, x)

    def embedding_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of the dequantized weight, fp32 [len(ids), K]: a tied embedding read from an int8 LM head."""
        return ops.dequant_q8_rows(self.q, self.s, ids, self.group_size)


class NativeW8A8Linear(NativeInt8Linear):
    """W8A8 on the int8 kernel: int8 weights per output channel, activations rounded to int8 with one scale per
    token, integer products (tally/quant/w8a8.py's definition; there `torch._int_mm`, a scalar loop on CPUs
    without VNNI). SmoothQuant: the weight holds W·s; activations are divided by s here unless the 1/s was
    folded into the preceding norm."""
    per_token = True
    add_to = QuantLinear.add_to  # the kernel's own add would skip the smoothing of x

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                 smooth: torch.Tensor | None = None) -> None:
        super().__init__(q, scale.reshape(-1, 1), bias)
        self.scheme = "w8a8"
        self.register_buffer("act_inv_smooth", None if smooth is None else 1.0 / smooth.float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(self._smoothed(x))

    def first_outputs(self, x: torch.Tensor, n: int) -> torch.Tensor:
        return super().first_outputs(self._smoothed(x), n)

    def _smoothed(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.act_inv_smooth is None else x * self.act_inv_smooth

