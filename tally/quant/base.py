"""What every quantized projection shares: [..., in] -> [..., out] in the compute dtype, bias, and the choice
between a few-token kernel (weight-only, bandwidth-bound decode) and a many-token kernel (compute-bound prefill)."""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from tally.quant.dispatch import matmul_dtype

# Dequantized weight per tile of the many-token path. Tiling keeps the dequantized rows in cache between the
# write and the matmul, and bounds the per-call copy to this size instead of the whole weight in fp32 (4x an
# int8 layer); the size is the measured best (docs/benchmarks.md#paths-chosen-by-measurement).
TILE_BYTES = 4 << 20
# The native layers' bf16 tiles (dequantized by tally/native/kernels.c): oneDNN's bf16 matmul wants wider tiles than
# the fp32 dequantize-and-multiply above (docs/benchmarks.md#paths-chosen-by-measurement).
BF16_TILE_BYTES = 16 << 20


# oneDNN, behind PyTorch's bf16 / fp16 matmuls on CPU, compiles and caches a kernel of a few MB for each shape it
# meets, up to 1,024 of them; prefill steps take every row count, so a server's memory would grow for hours
# (docs/benchmarks.md#reliability; `python benchmarks/kernel_cache_memory.py`). Rows are padded up to one of 8 sizes
# per octave (a power of two up to 16): a layer meets ~80 shapes up to 8,192 rows, for at most 12.5% more rows.
CACHED_KERNEL_DTYPES = (torch.bfloat16, torch.float16)


def bucketed_rows(rows: int) -> int:
    """Rows padded for a cached-kernel matmul: a power of two up to 16, else a multiple of 1/8 of the octave."""
    if rows <= 16:
        return 1 << (rows - 1).bit_length()
    step = 1 << (rows.bit_length() - 4)
    return -(-rows // step) * step


def pad_rows(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A 2-D input in `dtype` (default: its own) with zero rows added up to `bucketed_rows` (the caller keeps the
    first x.shape[0] outputs). One pass converts and pads, where a cast then F.pad would copy twice."""
    rows, dtype = x.shape[0], dtype or x.dtype
    padded = bucketed_rows(rows)
    if padded == rows:
        return x.to(dtype)  # no copy when the rows are a bucket already and the dtype is x's
    out = torch.empty(padded, x.shape[1], dtype=dtype, device=x.device)
    out[:rows].copy_(x)
    out[rows:].zero_()
    return out


def tiled_matmul(x: torch.Tensor, out_features: int, dtype: torch.dtype,
                 weight_t: Callable[[int, int], torch.Tensor], align: int = 1,
                 tile_bytes: int = TILE_BYTES) -> torch.Tensor:
    """QuantLinear._tiled_matmul for any layer that can produce its W^T a few columns at a time."""
    rows, in_features = x.shape
    n_total = -(-out_features // align) * align
    tile = max(align, tile_bytes // (in_features * dtype.itemsize) // align * align)
    x = pad_rows(x, dtype) if dtype in CACHED_KERNEL_DTYPES else x.to(dtype)
    if tile >= n_total:
        return (x @ weight_t(0, n_total))[:rows]
    out = torch.empty(x.shape[0], n_total, dtype=dtype, device=x.device)
    for n0 in range(0, n_total, tile):
        n1 = min(n0 + tile, n_total)
        out[:, n0:n1] = x @ weight_t(n0, n1)
    return out[:rows]


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
        self.matmul_dtype = matmul_dtype(compute_dtype)  # of the many-token path; fixed here, not per call
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

    def add_to(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """out += self(x), in place (a residual stream [M, out_features]): the bits of out + self(x)."""
        return out.add_(self(x))

    def first_outputs(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """Outputs 0..n-1 (a draft's reduced vocabulary: tally/engine/speculation/config.py, draft_vocab_size).
        Here every output, then the first n; the native layers read only the first n outputs' weights."""
        return self(x)[..., :n]

    def use_many_tokens(self, from_rows: int, dtype: torch.dtype) -> None:
        """Rows from `from_rows` on take the many-token path, multiplying in `dtype`: the start-up measurement's
        choice (tally/engine/startup/path_tuning.py) where it found one faster than the rule in dispatch.py."""
        self.many_tokens_from, self.matmul_dtype = from_rows, dtype

    def _few_tokens(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _many_tokens(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _tiled_matmul(self, x: torch.Tensor, dtype: torch.dtype,
                      weight_t: Callable[[int, int], torch.Tensor], align: int = 1) -> torch.Tensor:
        """x @ W^T, with W^T produced `align`-multiple column tiles at a time by weight_t(n0, n1) -> [K, n1 - n0]
        (any strides) in `dtype`; the result is [M, n_total] in `dtype`, n_total = the rows weight_t covers."""
        return tiled_matmul(x, self.out_features, dtype, weight_t, align)

    def weight_nbytes(self) -> int:
        """Bytes this layer holds for its weight (bias excluded): what the memory ledger should charge."""
        return sum(b.numel() * b.element_size() for name, b in self.named_buffers() if name != "bias")

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"compute_dtype={self.compute_dtype}, many_tokens_from={self.many_tokens_from}")
