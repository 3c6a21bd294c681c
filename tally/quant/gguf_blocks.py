"""GGUF quantized blocks adopted as they are stored, with no requantization: each block type's integers and scales
in the conventions of Tally's int4, 5- / 6-bit and int8 layers."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch

# Block layouts (ggml): 32 weights per block. Q4_0: fp16 d, 16 bytes of nibbles, w = d * (q - 8).
# Q4_1: fp16 d, fp16 m, 16 bytes of nibbles, w = d * q + m. Q8_0: fp16 d, 32 int8, w = d * q.
# Nibbles: byte j holds weight j (low) and weight j + 16 (high).
# Q4_K: super-blocks of 256 = 8 sub-blocks of 32: fp16 d, fp16 dmin, 12 bytes of 6-bit scales sc and mins mn,
# 128 bytes of nibbles (each 32 bytes: sub-block 2i in the low nibbles, 2i + 1 in the high); w = d*sc*q - dmin*mn,
# i.e. group-32 asymmetric int4 with scale d*sc and minimum -dmin*mn (both exact in fp32).
# In the int4 kernel's convention w = (q - 8) * scale + zero: Q4_0 is scale d, zero 0; Q4_1 is scale d, zero m + 8d.
# Q5_0: fp16 d, 4 bytes qh (bit j: the fifth bit of weight j), 16 bytes of nibbles as Q4_0; w = d * (q - 16).
# Q6_K: super-blocks of 256 = 16 sub-blocks of 16: 128 bytes ql (low nibbles), 64 bytes qh (2 high bits each),
# 16 int8 scales sc, fp16 d; w = d * sc * (q - 32), q in 0..63, i.e. group-16 6-bit values with scale d*sc.
# The native kernels hold both as their values (nibbles plus planes of high bits, tally/native/ops.py): Q5_0 in 6
# bits a weight with its scale (5.5 stored), Q6_K in 8 (6.56 stored, 16 as fp16). Elsewhere Q5_0's q - 16 is an
# int8 value (group-32 int8, exactly) and Q6_K is dequantized, as Q5_1 (a minimum) always is.
# MXFP4 (GPT-OSS's experts): a uint8 e8m0 exponent e, 16 bytes of e2m1 nibbles as Q4_0's; w = v(q) * 2^(e - 127) with
# v in {0, 0.5, 1, 1.5, 2, 3, 4, 6} and signs: twice v is an int8 value, so it is a table of 16 int8 values with scale
# 2^(e - 128) per group of 32, exactly (llama.cpp's own table, gguf.quants.MXFP4).
# IQ4_NL (fp16 d, nibbles as Q4_0's) and IQ4_XS (super-blocks of 256: fp16 d, 6-bit scales ls per 32): w = d (* ls) *
# v(q), v a table of 16 int8 values: TableBlocks with scale d (* ls) per 32, exactly. The native kernels hold the
# three as the 4-bit indices (LUT4, 0.5 bytes a weight plus the scales); elsewhere they are the int8 values.
# Q5_1 (fp16 d, m, 4 bytes qh, nibbles: w = d q + m) and Q5_K (Q4_K with a fifth bit per weight in 32 bytes qh) are
# 5-bit values with minima; Q2_K (16 groups of 16: 4-bit sc and mn, 2-bit q; w = d sc q - dmin mn) 2-bit values with
# minima, held as nibbles; Q3_K (16 groups of 16: 6-bit signed scales, 3-bit q - 4) as nibbles q - 4 + 8 without
# minima, w = d sc (q4 - 8). All exact, on the int4 kernels with their high-bit planes where the values need them.
BLOCK = 32
_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q8_0": 34, "Q4_K": 144, "Q6_K": 210, "MXFP4": 17,
                "Q5_1": 24, "Q5_K": 176, "Q3_K": 110, "Q2_K": 84, "IQ4_NL": 18, "IQ4_XS": 136}
IQ4_VALUES = torch.tensor([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=torch.int8)
_E2M1_DOUBLED = torch.tensor([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=torch.int8)
NATIVE_BLOCK_TYPES = frozenset(_BLOCK_BYTES)  # the GGUF block types served as stored; others are dequantized
_WEIGHTS_PER_BLOCK = {"Q4_K": 256, "Q6_K": 256, "Q5_K": 256, "Q3_K": 256, "Q2_K": 256, "IQ4_XS": 256}


@dataclass(frozen=True)
class SuperBlockValues:
    """Per-group values as the K-quants store them: an fp16 base per super-block of 256 weights (d, or -dmin) times
    a small integer per group (sc, mn); every product is exact in fp32. The native kernels hold them so
    (tally/native/ops.py: pack_tile_factors), at 1.125-1.25 bytes a group instead of fp32's 4."""

    base: torch.Tensor  # [N, K/256] fp32, fp16 values
    steps: torch.Tensor  # [N, K/group] int8 values

    def values(self) -> torch.Tensor:
        """The products, fp32 [N, K/group]."""
        per = self.steps.shape[1] // self.base.shape[1]
        return self.base.repeat_interleave(per, dim=1) * self.steps.float()


GroupValues = torch.Tensor | SuperBlockValues


@dataclass(frozen=True)
class Int4Blocks:
    """Int4Linear's convention: q uint8 [N, K] below 2**bits, w = (q - 8) * scale + zero per group (32, or Q2_K's and
    Q3_K's 16). Where given, `factors` are the values as the file stores them, exactly: (d, m) with w = q * d + m, m
    None for w = d * (q - 8) (Q4_K: d * sc and -dmin * mn as SuperBlockValues; Q5_1: its fp16 d and m)."""

    q: torch.Tensor
    scale: torch.Tensor  # [N, K/group]
    zero: torch.Tensor  # [N, K/group]
    factors: tuple[GroupValues, GroupValues | None] | None = None
    bits: int = 4  # 5: Q5_1's and Q5_K's values, which only the native kernels hold


@dataclass(frozen=True)
class Int8Blocks:
    """q int8 [N, K], w = q * scale[n, k // 32]."""

    q: torch.Tensor
    scale: torch.Tensor  # [N, K/32]


@dataclass(frozen=True)
class OffsetBlocks:
    """Q5_0 (bits 5, groups of 32) and Q6_K (bits 6, groups of 16): q uint8 [N, K] below 2**bits,
    w = (q - 2**(bits - 1)) * scale[n, k // group]."""

    q: torch.Tensor
    scale: torch.Tensor  # [N, K/group]
    bits: int
    factors: SuperBlockValues | None = None  # Q6_K's

    def as_int8(self) -> Int8Blocks:
        return Int8Blocks((self.q.to(torch.int16) - (1 << (self.bits - 1))).to(torch.int8), self.scale)


@dataclass(frozen=True)
class TableBlocks:
    """IQ4_NL, IQ4_XS, MXFP4: q uint8 [N, K] in 0..15, indices into table int8 [16];
    w = table[q] * scale[n, k // 32]."""

    q: torch.Tensor
    scale: torch.Tensor  # [N, K/32]
    table: torch.Tensor

    def as_int8(self) -> Int8Blocks:
        return Int8Blocks(self.table[self.q.long()], self.scale)


Blocks = Int4Blocks | OffsetBlocks | Int8Blocks | TableBlocks


def _blocks(raw: Any, type_name: str) -> np.ndarray:
    out_features, in_features = raw.shape
    data = np.ascontiguousarray(raw.data, dtype=np.uint8)
    per_block = _WEIGHTS_PER_BLOCK.get(type_name, BLOCK)
    return data.reshape(out_features, in_features // per_block, _BLOCK_BYTES[type_name])


def _fp16(blocks: np.ndarray, start: int) -> torch.Tensor:
    """[N, K/32] fp32 from the fp16 at byte `start` of every block."""
    return torch.from_numpy(np.ascontiguousarray(blocks[..., start:start + 2]).view(np.float16)[..., 0]
                            .astype(np.float32))


def _nibbles(blocks: np.ndarray, start: int) -> torch.Tensor:
    """[N, K] uint8 in 0..15 from the 16 nibble bytes at byte `start` of every block."""
    qs = blocks[..., start:start + BLOCK // 2]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
    return torch.from_numpy(q.reshape(blocks.shape[0], -1))


def _q5_0(blocks: np.ndarray) -> torch.Tensor:
    """Q5_0 blocks [N, K/32, 22] -> uint8 [N, K] in 0..31."""
    # bit j of the little-endian 32-bit qh is weight j's fifth bit: one byte a weight, no wider temporaries
    high = np.unpackbits(blocks[..., 2:6], axis=-1, bitorder="little") << 4  # [N, K/32, 32]
    low = _nibbles(blocks, 6).numpy().reshape(high.shape)
    return torch.from_numpy((low | high).reshape(blocks.shape[0], -1))


def _mxfp4(blocks: np.ndarray) -> TableBlocks:
    """MXFP4 blocks [N, K/32, 17] -> indices into twice the e2m1 values, scale 2^(e - 128) [N, K/32]."""
    # 2^-128 and 2^-127 are subnormal float32s: still exact
    scale = np.ldexp(np.float32(1), blocks[..., 0].astype(np.int32) - 128).astype(np.float32)
    return TableBlocks(_nibbles(blocks, 1), torch.from_numpy(scale), _E2M1_DOUBLED)


def _q4_k(blocks: np.ndarray) -> tuple[torch.Tensor, SuperBlockValues, SuperBlockValues]:
    """Q4_K super-blocks [N, S, 144] -> q uint8 [N, 256 S], scale d * sc and minimum -dmin * mn [N, 8 S] per 32
    weights."""
    d, dmin = _fp16(blocks, 0), _fp16(blocks, 2)
    b = blocks[..., 4:16].astype(np.uint8)
    sc = np.concatenate([b[..., 0:4] & 63, (b[..., 8:12] & 0xF) | ((b[..., 0:4] >> 6) << 4)], axis=-1)
    mn = np.concatenate([b[..., 4:8] & 63, (b[..., 8:12] >> 4) | ((b[..., 4:8] >> 6) << 4)], axis=-1)
    qs = blocks[..., 16:144].reshape(*blocks.shape[:2], 4, 32)
    q = np.stack([qs & 0x0F, qs >> 4], axis=3).reshape(blocks.shape[0], -1)
    return (torch.from_numpy(np.ascontiguousarray(q)), _steps(d, sc), _steps(-dmin, mn))


def _steps(base: torch.Tensor, steps: np.ndarray) -> SuperBlockValues:
    """base [N, S], steps [N, S, P] (6-bit or int8 values) -> SuperBlockValues"""
    return SuperBlockValues(base, torch.from_numpy(steps.astype(np.int8).reshape(steps.shape[0], -1)))


def _q6_k(blocks: np.ndarray) -> tuple[torch.Tensor, SuperBlockValues]:
    """Q6_K super-blocks [N, S, 210] -> q uint8 [N, 256 S] in 0..63, scale d * sc [N, 16 S] per 16 weights."""
    n, s = blocks.shape[:2]
    ql = blocks[..., :128].reshape(n, s, 2, 2, 32)  # [half, which 32 bytes, l]: nibbles of quarters (0, 1), (2, 3)
    qh = blocks[..., 128:192].reshape(n, s, 2, 1, 32)
    low = np.stack([ql[:, :, :, 0] & 15, ql[:, :, :, 1] & 15, ql[:, :, :, 0] >> 4, ql[:, :, :, 1] >> 4], axis=3)
    high = (qh >> (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 1, 4, 1)) & 3  # [n, s, half, quarter, l]
    q = (low | (high << 4)).reshape(n, -1)
    return torch.from_numpy(np.ascontiguousarray(q)), _steps(_fp16(blocks, 208), blocks[..., 192:208].view(np.int8))


def adopted_storage(type_name: str) -> tuple[str, int] | None:
    """(storage, group size) for the block types read_blocks adopts, None for those it leaves dense."""
    if type_name not in _BLOCK_BYTES:
        return None
    return {"Q8_0": ("int8", 32), "MXFP4": ("lut4", 32), "IQ4_NL": ("lut4", 32), "IQ4_XS": ("lut4", 32),
            "Q5_0": ("int5", 32), "Q5_1": ("int5", 32), "Q5_K": ("int5", 32), "Q6_K": ("int6", 16),
            "Q3_K": ("int4", 16), "Q2_K": ("int4", 16)}.get(type_name, ("int4", 32))


def concat_blocks(parts: list[Blocks | None]) -> Blocks | None:
    """Several tensors' blocks stacked by output rows, so a fused projection stays one layer: when all are of one
    kind (tables: one table), or of int8's values mixed (Q5_0 beside Q8_0, Qwen's q, k and v in a Q4_K_M file; a table
    beside either), which int8 holds exactly; None for other mixes (their parts stay apart)."""
    if any(p is None for p in parts):
        return None
    if all(isinstance(p, TableBlocks) and torch.equal(p.table, parts[0].table) for p in parts):
        return TableBlocks(torch.cat([p.q for p in parts]), torch.cat([p.scale for p in parts]), parts[0].table)
    kinds = {(type(p), getattr(p, "bits", 8), p.q.shape[1] // p.scale.shape[1]) for p in parts}
    if len(kinds) > 1 or any(isinstance(p, TableBlocks) for p in parts):  # tables here: more than one table
        if not kinds <= {(OffsetBlocks, 5, 32), (Int8Blocks, 8, 32), (TableBlocks, 8, 32)}:
            return None
        parts = [p if isinstance(p, Int8Blocks) else p.as_int8() for p in parts]
    return type(parts[0])(*(_stacked([getattr(p, f.name) for p in parts]) for f in fields(parts[0])))


def _stacked(values: list[Any]) -> Any:
    """One field of several blocks' stacked by output rows: tensors and factors (None unless every part has them);
    `bits`, shared, as it is."""
    if any(v is None for v in values):
        return None
    if isinstance(values[0], torch.Tensor):
        return torch.cat(values)
    if isinstance(values[0], SuperBlockValues):
        return SuperBlockValues(torch.cat([v.base for v in values]), torch.cat([v.steps for v in values]))
    if isinstance(values[0], tuple):
        return tuple(_stacked(list(part)) for part in zip(*values))
    return values[0]


def read_blocks(raw: Any) -> Blocks | None:
    """`raw`'s blocks as the integers and scales they store, exactly (Q4_0, Q4_1, Q4_K -> int4 group 32; Q5_0,
    Q6_K -> 5- and 6-bit values; Q8_0 -> int8 with block scales; IQ4_NL, IQ4_XS, MXFP4 -> table indices), or None
    for types that are not adopted (the caller dequantizes those). `raw` is duck-typed: fields ggml_type
    (gguf.GGMLQuantizationType), shape (out, in) in HF orientation, data (uint8 blocks, rows in HF order).
    tally/layers/linear.py turns them into a layer."""
    type_name = getattr(raw.ggml_type, "name", str(raw.ggml_type))
    if type_name not in _BLOCK_BYTES or len(raw.shape) != 2:
        return None
    blocks = _blocks(raw, type_name)
    if type_name == "MXFP4":
        return _mxfp4(blocks)
    if type_name in _MORE_TYPES:
        return _MORE_TYPES[type_name](blocks)
    if type_name == "Q6_K":
        q, scale = _q6_k(blocks)
        return OffsetBlocks(q, scale.values(), 6, scale)
    d = _fp16(blocks, 0)
    if type_name == "Q8_0":
        q = torch.from_numpy(np.ascontiguousarray(blocks[..., 2:]).view(np.int8).reshape(blocks.shape[0], -1))
        return Int8Blocks(q, d)
    if type_name == "Q5_0":
        return OffsetBlocks(_q5_0(blocks), d, 5)
    if type_name == "Q4_K":
        q, scale, minimum = _q4_k(blocks)
        return Int4Blocks(q, scale.values(), minimum.values() + 8.0 * scale.values(), (scale, minimum))
    if type_name == "Q4_0":
        return Int4Blocks(_nibbles(blocks, 2), d, torch.zeros_like(d))
    return Int4Blocks(_nibbles(blocks, 4), d, _fp16(blocks, 2) + 8.0 * d)


def _with_minima(q: torch.Tensor, d: GroupValues, m: GroupValues, bits: int) -> Int4Blocks:
    """w = q * d + m as Int4Blocks, the file's values kept as factors"""
    dv, mv = (v.values() if isinstance(v, SuperBlockValues) else v for v in (d, m))
    return Int4Blocks(q, dv, mv + 8.0 * dv, (d, m), bits)


def _q5_1(blocks: np.ndarray) -> Int4Blocks:
    q = _q5_0(np.concatenate([blocks[..., :2], blocks[..., 4:]], axis=-1))  # d, qh, nibbles: Q5_0's layout
    return _with_minima(q, _fp16(blocks, 0), _fp16(blocks, 2), 5)


def _q5_k(blocks: np.ndarray) -> Int4Blocks:
    q4, scale, minimum = _q4_k(np.concatenate([blocks[..., :16], blocks[..., 48:]], axis=-1))
    n, s = blocks.shape[:2]
    high = (blocks[..., 16:48].reshape(n, s, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)) & 1
    return _with_minima(q4 | torch.from_numpy(high.reshape(n, -1) << 4), scale, minimum, 5)


def _two_bit_fields(qs: np.ndarray) -> np.ndarray:
    """[N, S, 64] bytes of 2-bit values -> [N, 256 S] in llama.cpp's order: per half, per shift, 32 bytes."""
    n, s = qs.shape[:2]
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 1, 4, 1)
    return ((qs.reshape(n, s, 2, 1, 32) >> shifts) & 3).reshape(n, -1)


def _q2_k(blocks: np.ndarray) -> Int4Blocks:
    """scales [16] (sc low nibble, mn high), qs [64], d, dmin: w = d sc q - dmin mn per 16"""
    sc = blocks[..., :16]
    q = torch.from_numpy(np.ascontiguousarray(_two_bit_fields(blocks[..., 16:80])))
    return _with_minima(q, _steps(_fp16(blocks, 80), sc & 15), _steps(-_fp16(blocks, 82), sc >> 4), 4)


def _q3_k(blocks: np.ndarray) -> Int4Blocks:
    """hmask [32], qs [64], scales [12] (16 6-bit values, gguf.quants.Q3_K's unpacking), d: w = d (sc - 32) v per 16,
    v = q - 4 unless the mask bit is set; held as nibbles v + 8, no minima"""
    n, s = blocks.shape[:2]
    low = _two_bit_fields(blocks[..., 32:96])
    high = ((blocks[..., :32].reshape(n, s, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)) & 1)
    q = torch.from_numpy(np.ascontiguousarray(low + 4 * high.reshape(n, -1) + 4).astype(np.uint8))
    packed = blocks[..., 96:108]
    lo = (packed[..., :8].reshape(n, s, 1, 8) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)).reshape(n, s, 16)
    hi = (packed[..., 8:].reshape(n, s, 1, 4) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1))
    sc = ((lo & 15) | ((hi.reshape(n, s, 16) & 3) << 4)).astype(np.int16) - 32
    scale = _steps(_fp16(blocks, 108), sc)
    return Int4Blocks(q, scale.values(), torch.zeros(n, 16 * s), (scale, None))


def _iq4_nl(blocks: np.ndarray) -> TableBlocks:
    return TableBlocks(_nibbles(blocks, 2), _fp16(blocks, 0), IQ4_VALUES)


def _iq4_xs(blocks: np.ndarray) -> TableBlocks:
    """d, scales_h (2 bits a group, uint16), scales_l (4 bits a group), 8 groups of 16 nibble bytes"""
    n, s = blocks.shape[:2]
    high = np.ascontiguousarray(blocks[..., 2:4]).view("<u2") >> (2 * np.arange(8, dtype=np.uint16))  # [N, S, 8]
    low = (blocks[..., 4:8].reshape(n, s, 4, 1) >> np.array([0, 4], dtype=np.uint8)).reshape(n, s, 8)
    ls = ((low & 15) | ((high & 3).astype(np.uint8) << 4)).astype(np.float32) - 32
    q = _nibbles(blocks[..., 8:].reshape(n, s * 8, 16), 0)  # each group's 16 bytes as a Q4_0 block's nibbles
    scale = torch.from_numpy(ls) * _fp16(blocks, 0)[..., None]  # d * ls: an fp16 times a small integer, exact
    return TableBlocks(q, scale.reshape(n, -1), IQ4_VALUES)


_MORE_TYPES = {"Q5_1": _q5_1, "Q5_K": _q5_k, "Q2_K": _q2_k, "Q3_K": _q3_k, "IQ4_NL": _iq4_nl, "IQ4_XS": _iq4_xs}
