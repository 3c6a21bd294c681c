"""Tensor-level entry points to the native kernels (tally/native/kernels.c).

Each takes contiguous fp32 CPU tensors (weights in their stored formats) and returns a new tensor, or writes
into `out`. Shapes the kernels cannot take — a K the vector loop does not divide — are the caller's to avoid:
`*_supported` say which. Every function here assumes `available()`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from tally.native.library import load


# The KV cache formats the attention kernels read in place and rotary-and-store writes, numbered as kernels.c's
# kv_rows.h numbers them; the int8 cache (values and scales) has decode_attention's `scales` and the decode step.
KV_KINDS = {torch.float32: 0, torch.float16: 2, torch.bfloat16: 3}
KV_INT8 = 1


def available() -> bool:
    return load() is not None


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _output(x: torch.Tensor, n: int, out: torch.Tensor | None) -> torch.Tensor:
    return torch.empty(x.shape[0], n, dtype=torch.float32) if out is None else out


def integer_gemm_supported(in_features: int, group_size: int) -> bool:
    """gemm_q4 / gemm_q8 work in blocks of 32 (the activations' int8 blocks), whole groups per row; gemm_q4 with
    high-bit planes also in groups of 16 (Q6_K's), two to a block."""
    return (group_size % 32 == 0 or group_size == 16) and in_features % max(group_size, 32) == 0


TILE = 8  # outputs per integer weight tile (kernels.c): one fp32 lane each


def _tiles(t: torch.Tensor) -> torch.Tensor:
    """[N, ...] -> [T, 8, ...], T = ceil(N / 8), rows past N zero."""
    n = t.shape[0]
    padded = t.new_zeros(-(-n // TILE) * TILE, *t.shape[1:])
    padded[:n] = t
    return padded.view(-1, TILE, *t.shape[1:])


def fits_half(*values: torch.Tensor) -> bool:
    """Whether every value converts to fp16 and back unchanged: then pack_tile_scales may hold them in fp16 (GGUF's
    Q4_0 / Q4_1 / Q5_0 / Q8_0 keep d and m in fp16; a decode step streams half the bytes for them, same results)."""
    return all(bool(torch.equal(v.float().half().float(), v.float())) for v in values)


def pack_tile_scales(s: torch.Tensor, half: bool = False) -> torch.Tensor:
    """Per-group values [N, G] -> [T, G, 8], fp32 (or fp16 with `half`, where fits_half): per tile and group, its 8
    outputs side by side."""
    return _tiles(s.to(torch.float16 if half else torch.float32)).transpose(1, 2).contiguous()


def pack_tile_factors(base: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """Per-group values given as GGUF's K-quants store them, base [N, S] (fp16 values, one per super-block of P =
    G / S groups) times steps [N, G] (int8 values) -> uint8 [T, S, 16 + 8 P]: per tile and super-block the 8
    outputs' fp16 bases, then per group its 8 outputs' int8 steps (int_dots.h: GroupValues, form P)."""
    n_tiles, per = -(-base.shape[0] // TILE), steps.shape[1] // base.shape[1]
    if not fits_half(base) or per < 2 or per & (per - 1) or steps.shape[1] != per * base.shape[1]:
        raise ValueError("factored scales want fp16 bases, each over a power of two (>= 2) of groups")
    bases = pack_tile_scales(base, half=True).view(torch.uint8)  # [T, S, 16]
    steps8 = _tiles(steps.to(torch.int8)).transpose(1, 2).reshape(n_tiles, base.shape[1], per * TILE)  # [T, S, 8 P]
    return torch.cat([bases, steps8.view(torch.uint8)], dim=2).contiguous()


def tile_scale_rows(packed: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Rows of pack_tile_scales' input, [len(rows), G] (of pack_tile_factors': the products, fp32)."""
    if packed.dtype != torch.uint8:
        return packed[rows // TILE, :, rows % TILE]
    units, lanes = packed[rows // TILE], torch.arange(len(rows))  # [R, S, 16 + 8 P]: the rows' tiles only
    per = (packed.shape[2] - 2 * TILE) // TILE
    base = units[:, :, :2 * TILE].contiguous().view(torch.float16)[lanes, :, rows % TILE].float()  # [R, S]
    steps = units[:, :, 2 * TILE:].contiguous().view(torch.int8).view(*units.shape[:2], per, TILE)
    return (base[:, :, None] * steps[lanes, :, :, rows % TILE].float()).reshape(len(rows), -1)


def pack_q4(q: torch.Tensor) -> torch.Tensor:
    """int4 values [N, K] (uint8 0..15) -> gemm_q4's tiles uint8 [T, K/8, 32]: per 8 k, byte 4j + i holds
    (output j, k i) in its low nibble and (j, 4 + i) in its high nibble."""
    t = _tiles(q.to(torch.uint8))
    n_tiles, _, k = t.shape
    halves = t.view(n_tiles, TILE, k // 8, 2, 4).permute(0, 2, 3, 1, 4)  # [T, K/8, half, output, i]
    return (halves[:, :, 0] | (halves[:, :, 1] << 4)).reshape(n_tiles, k // 8, 32).contiguous()


def pack_planes(q: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """5- or 6-bit values [N, K] (uint8 below 2**bits) -> pack_q4's tiles of their low nibbles, and the bits above them
    uint8 [T, K/32, 32 * (bits - 4)] per block of 32 k (int_dots.h; vector s of a block: chunk s // 2's low nibbles for
    even s, high for odd). 5 bits: bit s of byte b is bit 4 of the value byte b of vector s holds. 6 bits, a plane of
    pairs: byte 32 * (c % 2) + b holds bits 4-5 of the values byte b of chunk c's vectors hold, the low nibbles' at
    bit 4 * (c // 2), the high nibbles' at 4 * (c // 2) + 2."""
    q = q.to(torch.uint8)
    n_tiles, k = -(-q.shape[0] // TILE), q.shape[1]
    width, (parts, shifts) = bits - 4, _plane_fields(bits)  # 32 bytes of planes a block per bit above the nibble
    above = _tiles(q >> 4).view(n_tiles, TILE, k // 32, 4, 2, 4)  # [T, output, block, chunk, half, i]
    plane = torch.zeros(n_tiles, k // 32, width, TILE, 4, dtype=torch.uint8)
    for c in range(4):  # uint8 shifts and ors: a large table packs in a fraction of a second
        for half in range(2):
            plane[:, :, int(parts[c, half])] |= above[:, :, :, c, half].transpose(1, 2) << int(shifts[c, half])
    return pack_q4(q & 15), plane.view(n_tiles, k // 32, 32 * width).contiguous()


def _plane_fields(bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where pack_planes puts the bits above the nibbles of chunk c's vector (half 0: the low nibbles', 1: the high
    nibbles'), each [4, 2]: the 32-byte part of the block's planes, and the bit there."""
    c, half = torch.arange(4).view(4, 1), torch.arange(2).view(1, 2)
    if bits == 6:
        return (c % 2).expand(4, 2), 4 * (c // 2) + 2 * half
    return torch.zeros(4, 2, dtype=torch.long), 2 * c + half


LUT4 = 3  # int_dots.h: 4-bit indices into a table of 16 int8 values (gemm_q4's `qh` the table)


def _bits(qh: torch.Tensor | None) -> int:
    """4 for plain nibbles, LUT4 for a table of values, else 4 + pack_planes' planes."""
    if qh is None:
        return 4
    return LUT4 if qh.dim() == 1 else 4 + qh.shape[2] // 32


def scale_form(*values: torch.Tensor | None) -> int:
    """The kernels' `scale_form` argument (int_dots.h: GroupValues) for packed per-group values: 0 fp32, 1 fp16 (both
    pack_tile_scales'), P for pack_tile_factors' super-blocks of P groups; a layer's scales and minima share one."""
    forms = {0 if v.dtype == torch.float32 else 1 if v.dtype == torch.float16
             else (v.shape[2] - 2 * TILE) // TILE if v.dtype == torch.uint8 else -1 for v in values if v is not None}
    if len(forms) != 1 or -1 in forms:
        dtypes = sorted({str(v.dtype) for v in values if v is not None})
        raise ValueError(f"scales and minima must share one form (fp32, fp16 or factored), got {dtypes}")
    return forms.pop()


def q4_rows(qs: torch.Tensor, rows: torch.Tensor, qh: torch.Tensor | None = None) -> torch.Tensor:
    """Rows of pack_q4's (with `qh`: pack_planes') input, uint8 [len(rows), K]."""
    n_tiles, chunks = qs.shape[0], qs.shape[1]
    b = qs.view(n_tiles, chunks, TILE, 4)[rows // TILE, :, rows % TILE]  # [R, K/8, 4]
    q = torch.stack([b & 15, b >> 4], dim=2)  # [R, K/8, half, i]
    if qh is not None:
        bits = _bits(qh)
        width, (parts, shifts) = bits - 4, _plane_fields(bits)
        h = qh.view(n_tiles, chunks // 4, width, TILE, 4)[rows // TILE, :, :, rows % TILE]  # [R, K/32, part, i]
        above = (h[:, :, parts] >> shifts.to(torch.uint8)[..., None]) & ((1 << width) - 1)  # [R, K/32, chunk, half, i]
        q = q | (above.view(q.shape) << 4)
    return q.reshape(len(rows), -1)


def pack_q8(q: torch.Tensor) -> torch.Tensor:
    """int8 [N, K] -> gemm_q8's tiles int8 [T, K/4, 32]: per 4 k, byte 4j + i holds (output j, k i)."""
    t = _tiles(q.to(torch.int8))
    return t.view(t.shape[0], TILE, -1, 4).transpose(1, 2).reshape(t.shape[0], -1, 32).contiguous()


def symmetric_q8(q: torch.Tensor) -> bool:
    """Whether no int8 weight is -128 (gemm_q8's `symmetric`: GGUF's Q8_0 and symmetric rounding stay within 127)."""
    return q.numel() == 0 or int(q.min()) > -128


def q8_rows(packed: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Rows of pack_q8's input, int8 [len(rows), K]."""
    return packed.view(packed.shape[0], -1, TILE, 4)[rows // TILE, :, rows % TILE].reshape(len(rows), -1)


def dequant_q4_bf16(qs: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None, group_size: int,
                    qh: torch.Tensor | None = None) -> torch.Tensor:
    """W [8 T, K] in bf16 from a run of whole tiles of pack_q4 / pack_tile_scales (rows past N come out as
    their zero padding): the many-token path of a native int4 layer dequantizes a few tiles at a time. With
    `qh` (pack_planes' high bits) the values have 5 or 6 bits and m is None: w = d * (q - 2**(bits - 1)); with `qh`
    a table int8 [16] (LUT4) w = d * qh[q]."""
    n_tiles, k = qs.shape[0], qs.shape[1] * 8
    w = torch.empty(n_tiles * TILE, k, dtype=torch.bfloat16)
    load().tally_dequant_q4_bf16(qs.data_ptr(), _ptr(qh), d.data_ptr(), _ptr(m), w.data_ptr(), n_tiles, k,
                                 group_size, _bits(qh), scale_form(d, m))
    return w


def dequant_q4_rows(qs: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None, rows: torch.Tensor, group_size: int,
                    qh: torch.Tensor | None = None) -> torch.Tensor:
    """Rows of the dequantized weight, fp32 [len(rows), K], w = q * d + m (two roundings: q4_rows and
    tile_scale_rows' values combined in PyTorch give the same floats; `qh` as dequant_q4_bf16's): a token table's
    lookup."""
    rows = rows.to(torch.int64).contiguous()
    k = qs.shape[1] * 8
    out = torch.empty(len(rows), k)
    _rows_inside(load().tally_dequant_q4_rows(qs.data_ptr(), _ptr(qh), d.data_ptr(), _ptr(m), rows.data_ptr(),
                                              len(rows), qs.shape[0] * TILE, k, group_size, _bits(qh),
                                              scale_form(d, m), out.data_ptr()), rows, qs.shape[0] * TILE)
    return out


def dequant_q8_rows(q: torch.Tensor, s: torch.Tensor, rows: torch.Tensor, group_size: int) -> torch.Tensor:
    """Rows of the dequantized weight, fp32 [len(rows), K], w = q * s: as dequant_q4_rows."""
    rows = rows.to(torch.int64).contiguous()
    k = q.shape[1] * 4
    out = torch.empty(len(rows), k)
    _rows_inside(load().tally_dequant_q8_rows(q.data_ptr(), s.data_ptr(), rows.data_ptr(), len(rows),
                                              q.shape[0] * TILE, k, group_size, scale_form(s), out.data_ptr()),
                 rows, q.shape[0] * TILE)
    return out


def _rows_inside(status: int, rows: torch.Tensor, table_rows: int) -> None:
    if status < 0:  # the kernel read nothing: as PyTorch's indexing, an error
        raise IndexError(f"rows {rows.tolist()[:5]} reach outside a table of {table_rows} rows")


def dequant_q8_bf16(q: torch.Tensor, s: torch.Tensor, group_size: int) -> torch.Tensor:
    """W [8 T, K] in bf16 from tiles of pack_q8 / pack_tile_scales, as dequant_q4_bf16."""
    n_tiles, k = q.shape[0], q.shape[1] * 4
    w = torch.empty(n_tiles * TILE, k, dtype=torch.bfloat16)
    load().tally_dequant_q8_bf16(q.data_ptr(), s.data_ptr(), w.data_ptr(), n_tiles, k, group_size, scale_form(s))
    return w


def gemm_q4(x: torch.Tensor, qs: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None,
            bias: torch.Tensor | None, group_size: int, out_features: int, out: torch.Tensor | None = None,
            qh: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ W^T, W = q * d + m per group: qs from pack_q4, d and m from pack_tile_scales; m None:
    W = d * (q - 2**(bits - 1)), GGUF's Q4_0. With `qh` (qs and qh from pack_planes) the values have 5 or 6 bits and m
    is None: GGUF's Q5_0 (groups of 32) and Q6_K (16). With `qh` a table int8 [16] (LUT4), W = d * qh[q] and m is
    None (groups of 32): GGUF's IQ4_NL, IQ4_XS and MXFP4 as stored. With `out` given, the product is added to it (a
    residual stream). Activations are rounded to int8 per block of 32; with d and m from pack_tile_factors (a
    K-quant's) per 256 (int_tiles.h: activation_block)."""
    y = _output(x, out_features, out)
    load().tally_gemm_q4(x.data_ptr(), qs.data_ptr(), _ptr(qh), d.data_ptr(), _ptr(m), _ptr(bias), y.data_ptr(),
                         x.shape[0], out_features, x.shape[1], group_size, _bits(qh), out is not None,
                         scale_form(d, m))
    return y


def gemm_q8(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, bias: torch.Tensor | None, group_size: int,
            out_features: int, out: torch.Tensor | None = None, per_token: bool = False,
            symmetric: bool = False) -> torch.Tensor:
    """x [M, K] @ W^T, W = q * s per group (group K: one scale per output channel): q from pack_q8, s from
    pack_tile_scales. Activations are rounded to int8 per block of 32, or per row with `per_token` (W8A8).
    `symmetric`: no weight is -128 (`symmetric_q8`), so a one-row call on AVX2 may take a faster loop (same bits)."""
    y = _output(x, out_features, out)
    load().tally_gemm_q8(x.data_ptr(), q.data_ptr(), s.data_ptr(), _ptr(bias), y.data_ptr(), x.shape[0],
                         out_features, x.shape[1], group_size, out is not None, per_token, scale_form(s), symmetric)
    return y


PANEL = 16  # outputs per weight panel (kernels.c)


def pack_f16(weight: torch.Tensor, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """weight [N, K] -> panels [ceil(N/16), K, 16] of `dtype` (rows past N zero), the layout gemm_f16 reads (fp32
    panels: gemm_f32)."""
    n, k = weight.shape
    padded = torch.zeros(-(-n // PANEL) * PANEL, k, dtype=dtype)
    padded[:n] = weight
    return padded.view(-1, PANEL, k).transpose(1, 2).contiguous()


def panel_rows(panels: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Rows of the weight packed by pack_f16, as fp32 [len(rows), K]: a tied embedding read from the LM head."""
    return panels[rows // PANEL, :, rows % PANEL].float()


def dequant_f16_bf16_t(panels: torch.Tensor) -> torch.Tensor:
    """W^T [K, 16 P] in bf16 from a run of whole panels of pack_f16 (the layout makes W^T the cheap one)."""
    n_panels, k = panels.shape[0], panels.shape[1]
    w_t = torch.empty(k, n_panels * PANEL, dtype=torch.bfloat16)
    load().tally_dequant_f16_bf16(panels.data_ptr(), w_t.data_ptr(), n_panels, k)
    return w_t


def gemm_f16(x: torch.Tensor, panels: torch.Tensor, out_features: int, bias: torch.Tensor | None,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ W^T with W in fp16 panels (pack_f16), fp32 arithmetic."""
    return _gemm_panels(load().tally_gemm_f16, x, panels, out_features, bias, out)


def gemm_f32(x: torch.Tensor, panels: torch.Tensor, out_features: int, bias: torch.Tensor | None,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ W^T with W in fp32 panels (pack_f16(w, torch.float32)): each output one FMA chain over k in order,
    bitwise the same at any row count."""
    return _gemm_panels(load().tally_gemm_f32, x, panels, out_features, bias, out)


def gemm_bf16(x: torch.Tensor, panels: torch.Tensor, out_features: int, bias: torch.Tensor | None,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ W^T with W in bf16 panels (pack_f16(w, torch.bfloat16)), widened exactly to fp32: as gemm_f32,
    bitwise the same at any row count."""
    return _gemm_panels(load().tally_gemm_bf16, x, panels, out_features, bias, out)


def _gemm_panels(fn: Any, x: torch.Tensor, panels: torch.Tensor, out_features: int, bias: torch.Tensor | None,
                 out: torch.Tensor | None) -> torch.Tensor:
    y = _output(x, out_features, out)
    fn(x.data_ptr(), panels.data_ptr(), _ptr(bias), y.data_ptr(), x.shape[0], out_features, panels.shape[1],
       out is not None)
    return y


def vector_supported(dim: int) -> bool:
    """Norms, rotary and attention read rows of `dim` floats 8 at a time."""
    return dim % 8 == 0


def softcap_rows(x: torch.Tensor, cap: float) -> torch.Tensor:
    """cap * tanh(x / cap) of fp32 [M, N] rows (Gemma 2's logits), each row's bits whatever rows come with it, and the
    same as the one-call decode step's."""
    x = x.contiguous()
    y = torch.empty_like(x)
    load().tally_softcap_rows(x.data_ptr(), y.data_ptr(), x.shape[0], x.shape[-1], cap)
    return y


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                      first_pos: int, window: int | None, scale: float, softcap: float | None = None,
                      sinks: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """q [n, Hq, D] (rows may be strided, heads contiguous): one sequence's tokens at positions first_pos ..
    first_pos + n - 1, causal over its caches [blocks, block_size, Hkv, D] (a KV_KINDS dtype) through block_table
    int64 [blocks] (those tokens' keys already written) -> [n, Hq, D] fp32, written into `out` when given.
    `softcap` and `sinks` as decode_attention's. A row's bits do not depend on which rows come with it."""
    n, hq, d = q.shape
    if q.stride(2) != 1 or q.stride(1) != d:
        q = q.contiguous()
    target = out if out is not None and out.is_contiguous() else torch.empty(n, hq, d, dtype=torch.float32)
    load().tally_prefill_attention(q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(),
                                   KV_KINDS[k_cache.dtype], block_table.data_ptr(), n, first_pos, hq, k_cache.shape[2],
                                   d, k_cache.shape[1], window or 0, scale, softcap or 0.0, _ptr(sinks),
                                   target.data_ptr())
    if out is None:
        return target
    if target is not out:
        out.copy_(target)
    return out


def pool_helper_pieces() -> int:
    """Pieces of work the kernels' helper threads have run in this process (tally/native/pool.h): whether calls
    were split at all, which their results cannot show."""
    return load().tally_pool_helper_pieces()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    y = torch.empty_like(x)
    load().tally_rms_norm(x.data_ptr(), weight.data_ptr(), y.data_ptr(), x.numel() // x.shape[-1], x.shape[-1], eps)
    return y


def _sampled_rows(x: torch.Tensor, rows: torch.Tensor | None,
                  temperature: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The sampler's kernels' row arguments (sampling.h: SampledRows), held while the call runs: x as float32 rows,
    the int64 row indices into it (or None: every row in order), one float32 temperature a row read (or None: 1)."""
    return (x.float().contiguous(), None if rows is None else rows.to(torch.int64).contiguous(),
            None if temperature is None else temperature.float().reshape(-1).contiguous())


def sample_rows(x: torch.Tensor, u: torch.Tensor, rows: torch.Tensor | None = None,
                temperature: torch.Tensor | None = None) -> torch.Tensor:
    """A token a row of logits x [M, V] (filters applied, -inf dropped; with `rows` [M], row i is x[rows[i]] of a
    larger x) at u [M] (float64, in [0, 1)): the first in token order whose running mass of softmax(x / temperature)
    (temperature [M] or [M, 1]; none: 1) passes u of the row's, int64 [M]; -1 for a row holding a NaN or +inf, or
    keeping nothing (the caller's)."""
    x, rows, temperature = _sampled_rows(x, rows, temperature)
    u = u.double().contiguous()
    out = torch.empty(u.shape[0], dtype=torch.int64)
    load().tally_sample_rows(x.data_ptr(), _ptr(rows), u.shape[0], x.shape[1], _ptr(temperature), u.data_ptr(),
                             out.data_ptr())
    return out


def logsumexp_rows(x: torch.Tensor, rows: torch.Tensor | None = None,
                   temperature: torch.Tensor | None = None) -> torch.Tensor:
    """torch.logsumexp(x / temperature, dim=-1, keepdim=True) of rows [M, V] (with `rows` and `temperature` as
    sample_rows takes them), float32 [M, 1] (the sum of exps in double)."""
    x, rows, temperature = _sampled_rows(x, rows, temperature)
    m = x.shape[0] if rows is None else rows.shape[0]
    out = torch.empty(m, 1)
    load().tally_logsumexp_rows(x.data_ptr(), _ptr(rows), m, x.shape[1], _ptr(temperature), out.data_ptr())
    return out


def top_rows(x: torch.Tensor, k: int, rows: torch.Tensor | None = None,
             temperature: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(values [M, k], ids [M, k], done [M] bool): each row's k largest, descending (ties: the smaller id first), as
    torch.topk(sorted=True) gives them (k <= V), the values divided by the row's temperature (with `rows` and
    `temperature` as sample_rows takes them); a row holding a NaN is not done (the caller's)."""
    x, rows, temperature = _sampled_rows(x, rows, temperature)
    m = x.shape[0] if rows is None else rows.shape[0]
    values = torch.empty(m, k)
    ids = torch.empty(m, k, dtype=torch.int64)
    done = torch.empty(m, dtype=torch.int64)
    load().tally_top_rows(x.data_ptr(), _ptr(rows), m, x.shape[1], k, _ptr(temperature), values.data_ptr(),
                          ids.data_ptr(), done.data_ptr())
    return values, ids, done.bool()


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """torch.argmax(x, dim=-1) of rows [M, V] (the first index of each row's maximum), int64 [M]."""
    x = x.float().contiguous()  # as they come from the LM head: no copy
    out = torch.empty(x.shape[0], dtype=torch.int64)
    if load().tally_argmax_rows(x.data_ptr(), x.shape[0], x.shape[1], out.data_ptr()):
        nan_rows = (out < 0).nonzero().flatten()  # rows holding a NaN: torch's own answer (its first NaN)
        out[nan_rows] = x[nan_rows].argmax(dim=-1)
    return out


READ_CHUNK = 256 << 10  # kernels.c: tally_read_bytes


def read_folds(buf: torch.Tensor) -> torch.Tensor:
    """One read of contiguous `buf` by the kernels' threads, plain loads only: per READ_CHUNK bytes, the xor of its
    8-byte words (a ragged end's bytes xor-ed into the low byte), which keeps every load."""
    slots = torch.empty(-(-buf.nbytes // READ_CHUNK), dtype=torch.int64)
    load().tally_read_bytes(buf.data_ptr(), buf.nbytes, slots.data_ptr())
    return slots


def read_seconds(buf: torch.Tensor, repeats: int = 5) -> float:
    """The fastest of `repeats` reads (read_folds) of `buf`: the memory's own read rate is buf.nbytes over it
    (benchmarks/decode_roofline.py's roofline)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        read_folds(buf)
        best = min(best, time.perf_counter() - start)
    return best


ACTIVATIONS = {"silu": 0, "gelu_tanh": 1, "clamped_swiglu": 2}  # gated.h: ACT_SILU, ACT_GELU_TANH, ACT_CLAMPED_SWIGLU


def gated_mul(gate_up: torch.Tensor, activation: str = "silu", alpha: float = 0.0, limit: float = 0.0) -> torch.Tensor:
    """[M, 2I] (gate, up) -> act(gate) * up [M, I], act one of ACTIVATIONS (GELU-tanh: Gemma's GeGLU; clamped SwiGLU:
    GPT-OSS's, with its `alpha` and `limit`)."""
    m, i2 = gate_up.shape
    y = torch.empty(m, i2 // 2, dtype=torch.float32)
    load().tally_gated_mul(gate_up.data_ptr(), y.data_ptr(), m, i2 // 2, ACTIVATIONS[activation], alpha, limit)
    return y


@dataclass(frozen=True)
class Int8Store:
    """What rope_store writes into an int8 cache beside the values: the scales fp32 [blocks, block_size, Hkv], and
    the key smoothing (tally/models/key_smoothing.py) applied to q [Hq, D] and k [Hkv, D] first, or None."""
    k_scales: torch.Tensor
    v_scales: torch.Tensor
    query_scale: torch.Tensor | None
    key_scale: torch.Tensor | None


def rope_store(qkv: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None, num_heads: int,
               num_kv_heads: int, head_dim: int, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
               q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None, norm_whole: bool = False,
               eps: float = 0.0, int8: Int8Store | None = None) -> None:
    """Norm (with q_norm and k_norm: RMSNorm of each head, or `norm_whole` of all heads at once, before the
    rotation), then rotate q and k of qkv [T, (Hq + 2 Hkv) D] in place (cos/sin [T, R]: each head's first R
    dimensions; None: no rotary), then store k and v at `slots` (int64 [T]) of the caches [blocks, block_size, Hkv, D]
    (a KV_KINDS dtype, rounded to nearest even as torch casts; `int8`: int8 values, quantized as
    tally/attention/kv_cache.py does)."""
    if not qkv.is_contiguous():
        raise ValueError("rope_store rotates qkv in place and needs it contiguous")
    head = (qkv.data_ptr(), qkv.shape[0], qkv.shape[1], _ptr(q_norm), _ptr(k_norm), norm_whole, eps, _ptr(cos),
            _ptr(sin), head_dim if cos is None else cos.shape[-1], num_heads, num_kv_heads, head_dim)
    if int8 is None:
        load().tally_rope_store(*head, k_cache.data_ptr(), v_cache.data_ptr(), slots.data_ptr(),
                                KV_KINDS[k_cache.dtype])
    else:
        load().tally_rope_store_q8(*head, _ptr(int8.query_scale), _ptr(int8.key_scale), k_cache.data_ptr(),
                                   v_cache.data_ptr(), int8.k_scales.data_ptr(), int8.v_scales.data_ptr(),
                                   slots.data_ptr())


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                     context_lens: torch.Tensor, window: int | None, scale: float,
                     softcap: float | None = None, sinks: torch.Tensor | None = None,
                     out: torch.Tensor | None = None,
                     scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """q [n, Hq, D] (one token per row; rows may be strided, heads contiguous) against caches [blocks,
    block_size, Hkv, D] (a KV_KINDS dtype) through block_tables int64 [>= n, max_blocks] (stride 0: one table for
    every row, a prompt's rows run as decodes) and context_lens int64 [n] -> [n, Hq, D], written into a contiguous
    `out` when given. `softcap`: scores = softcap * tanh(scores / softcap) before the softmax (Gemma 2); `sinks`:
    fp32 [Hq] logits in each softmax's denominator (GPT-OSS). `scales`: int8 caches' K and V scales fp32
    [blocks, block_size, Hkv] (tally/attention/kv_cache.py)."""
    n, hq, d = q.shape
    out = torch.empty(n, hq, d, dtype=torch.float32) if out is None else out
    shape = (k_cache.shape[2], d, k_cache.shape[1], window or 0, scale, softcap or 0.0, _ptr(sinks), out.data_ptr())
    if scales is None:
        load().tally_decode_attention(q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(),
                                      KV_KINDS[k_cache.dtype], block_tables.data_ptr(), block_tables.stride(0),
                                      context_lens.data_ptr(), n, hq, *shape)
    else:
        load().tally_decode_attention_q8(q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(),
                                         scales[0].data_ptr(), scales[1].data_ptr(), block_tables.data_ptr(),
                                         block_tables.stride(0), context_lens.data_ptr(), n, hq, *shape)
    return out
