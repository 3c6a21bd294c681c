"""Reads a GGUF file's metadata and tensor table (not its weights), and maps the metadata
to a ModelConfig. Torch-free, so the ledger can plan from a GGUF without loading it.

gguf.GGUFReader builds a numpy view per metadata item, which takes seconds on a large vocabulary;
this walks the same bytes with struct and keeps string arrays (vocabulary, merges) as their length,
since the tokenizer reads them itself."""
from __future__ import annotations

import struct
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import GGUFValueType as V

from tally.errors import ModelLoadError
from tally.models.config import ModelConfig
from tally.models.families import gguf_family
from tally.models.families.gguf_fields import GGUFKey, float32_literal, yarn_scaling

_SCALARS = {V.UINT8: "<B", V.INT8: "<b", V.UINT16: "<H", V.INT16: "<h", V.UINT32: "<I", V.INT32: "<i",
            V.FLOAT32: "<f", V.BOOL: "<?", V.UINT64: "<Q", V.INT64: "<q", V.FLOAT64: "<d"}
_DEFAULT_ALIGNMENT_BYTES = 32
_FIRST_READ_BYTES = 4 << 20  # the built-in model's header (vocabulary + merges) is ~1.5 MB
ROPE_FREQS = "rope_freqs.weight"  # Llama 3.1+: what each rotary frequency is divided by
ROPE_LONG, ROPE_SHORT = "rope_factors_long.weight", "rope_factors_short.weight"  # LongRoPE's divisors (Phi-3)
ROPE_TENSORS = (ROPE_FREQS, ROPE_LONG, ROPE_SHORT)  # tensors that carry the rotary scaling, not weights


@dataclass(frozen=True)
class TensorInfo:
    name: str  # GGUF name, e.g. "blk.0.attn_q.weight"
    ggml_type: GGMLQuantizationType
    shape: tuple[int, ...]  # torch order (GGUF lists dimensions fastest-first)
    offset: int  # absolute byte offset in the file
    nbytes: int


@dataclass(frozen=True)
class GGUFHeader:
    metadata: dict[str, Any]  # string arrays are given as their length
    tensors: list[TensorInfo]

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "?"))


class _Truncated(Exception):
    pass


class _Cursor:
    def __init__(self, buf: memoryview) -> None:
        self.buf, self.pos = buf, 0

    def unpack(self, fmt: str) -> tuple:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise _Truncated
        values = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return values

    def string(self) -> str:
        (length,) = self.unpack("<Q")
        end = self.pos + length
        if end > len(self.buf):
            raise _Truncated
        text = bytes(self.buf[self.pos:end]).decode("utf-8", errors="replace")
        self.pos = end
        return text

    def value(self, kind: int) -> Any:
        if kind == V.STRING:
            return self.string()
        if kind != V.ARRAY:
            return self.unpack(_SCALARS[V(kind)])[0]
        item_kind, count = self.unpack("<IQ")
        if item_kind == V.STRING:  # vocabularies: skip over, keep the count
            for _ in range(count):
                (length,) = self.unpack("<Q")
                self.pos += length
            if self.pos > len(self.buf):
                raise _Truncated
            return count
        if item_kind == V.ARRAY:
            return [self.value(V.ARRAY) for _ in range(count)]
        fmt = _SCALARS[V(item_kind)]
        width = struct.calcsize(fmt)
        if self.pos + width * count > len(self.buf):
            raise _Truncated
        values = np.frombuffer(self.buf, dtype=np.dtype(fmt), count=count, offset=self.pos)
        self.pos += width * count
        return values.tolist()


def read_header(path: Path) -> GGUFHeader:
    """Metadata and tensor table; checks the file is long enough to hold every tensor."""
    file_bytes = path.stat().st_size
    head_bytes = _FIRST_READ_BYTES
    while True:  # the header's length is only known once it is parsed: read more until it fits
        with open(path, "rb") as f:
            cursor = _Cursor(memoryview(f.read(head_bytes)))
        try:
            return _parse(cursor, path, file_bytes)
        except _Truncated:
            if len(cursor.buf) < file_bytes:
                head_bytes *= 4
                continue
            raise ModelLoadError(
                f"{path} is truncated or corrupt: its header runs past the end of the file "
                f"({file_bytes:,} bytes); re-download or re-convert it"
            ) from None
        except (ValueError, KeyError, struct.error) as exc:
            raise ModelLoadError(f"{path} has a corrupt GGUF header ({exc}); re-download or re-convert it") from exc


def _parse(cursor: _Cursor, path: Path, file_bytes: int) -> GGUFHeader:
    magic = bytes(cursor.buf[:4])
    if magic != b"GGUF":
        raise ModelLoadError(f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF')")
    cursor.pos = 4
    version, tensor_count, kv_count = cursor.unpack("<IQQ")
    if version not in (2, 3):
        raise ModelLoadError(f"{path} is GGUF version {version}; Tally reads versions 2 and 3 (little-endian)")
    metadata: dict[str, Any] = {}
    for _ in range(kv_count):
        key = cursor.string()
        (kind,) = cursor.unpack("<I")
        metadata[key] = cursor.value(kind)
    table = []
    for _ in range(tensor_count):
        name = cursor.string()
        (n_dims,) = cursor.unpack("<I")
        dims = cursor.unpack(f"<{n_dims}Q")
        type_id, offset = cursor.unpack("<IQ")
        table.append((name, tuple(reversed(dims)), GGMLQuantizationType(type_id), offset))
    alignment = int(metadata.get("general.alignment", _DEFAULT_ALIGNMENT_BYTES))
    data_start = -(-cursor.pos // alignment) * alignment
    tensors = []
    for name, shape, ggml_type, offset in table:
        block_elements, block_bytes = GGML_QUANT_SIZES[ggml_type]
        info = TensorInfo(name, ggml_type, shape, data_start + offset, prod(shape) // block_elements * block_bytes)
        if info.offset + info.nbytes > file_bytes:
            raise ModelLoadError(
                f"{path} is truncated: tensor {name} needs bytes up to {info.offset + info.nbytes:,} but the "
                f"file has {file_bytes:,}; re-download or re-convert it"
            )
        tensors.append(info)
    return GGUFHeader(metadata, tensors)


def gguf_config(header: GGUFHeader, path: Path) -> ModelConfig:
    """ModelConfig from `{arch}.*` and `tokenizer.ggml.*` metadata, the rotary tensors (ROPE_TENSORS) and the
    family's traits (tally/models/families/)."""
    meta, arch = header.metadata, header.architecture
    fam = gguf_family(arch, str(path))

    def key(name: str, default: object = ModelLoadError) -> object:
        value = meta.get(f"{arch}.{name}", default)
        if value is ModelLoadError:
            raise ModelLoadError(f"{path} lacks the metadata key {arch}.{name}; the file is incomplete")
        return value

    heads, hidden = int(key("attention.head_count")), int(key("embedding_length"))
    kv_heads = key("attention.head_count_kv", heads)
    if isinstance(kv_heads, list):  # per-layer counts; the same in every layer for the archs we read
        if len(set(kv_heads)) != 1:
            raise ModelLoadError(f"{path} has a different KV head count per layer ({kv_heads}); Tally needs one")
        kv_heads = kv_heads[0]
    names = {t.name for t in header.tensors}
    shapes = {t.name: t.shape for t in header.tensors}
    token_count = meta.get("tokenizer.ggml.tokens")
    eos_ids = [meta.get(k) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")]
    window = key("attention.sliding_window", None)
    head_dim = int(key("attention.key_length", hidden // heads))
    rotary_dim = int(key("rope.dimension_count", head_dim))
    q_norm = shapes.get("blk.0.attn_q_norm.weight")
    fields = dict(
        architecture=fam.name,
        vocab_size=int(token_count if token_count is not None else key("vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length")),
        num_layers=int(key("block_count")),
        num_heads=heads,
        num_kv_heads=int(kv_heads),
        head_dim=head_dim,
        rms_norm_eps=float32_literal(key("attention.layer_norm_rms_epsilon")),
        rope_theta=float(key("rope.freq_base", 10000.0)),
        rope_scaling=_rope_scaling(header, path, key, rotary_dim),
        max_position_embeddings=int(key("context_length")),
        tie_word_embeddings="output.weight" not in names,
        attention_bias="blk.0.attn_q.bias" in names,
        qk_norm=None if q_norm is None else "head" if q_norm == (head_dim,) else "projection",
        sliding_window=int(window) if window else None,
        partial_rotary_factor=rotary_dim / head_dim,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=tuple(dict.fromkeys(int(e) for e in eos_ids if e is not None)),
        torch_dtype=_torch_dtype(header.tensors),
    )
    return ModelConfig(**fields | fam.traits_from_gguf(key, names))


def _rope_scaling(header: GGUFHeader, path: Path, key: GGUFKey, rotary_dim: int) -> dict | None:
    """The rotary scaling as the metadata names it, or as llama.cpp reads it from tensors for any architecture:
    each frequency's divisor (`rope_freqs`, Llama 3.1+) or LongRoPE's long and short ones (Phi-3)."""
    tensors = {t.name: t for t in header.tensors if t.name in ROPE_TENSORS}
    if ROPE_FREQS in tensors:
        return {"rope_type": "divisors", "divisors": _rope_vector(path, tensors, ROPE_FREQS, rotary_dim)}
    if ROPE_LONG in tensors or ROPE_SHORT in tensors:
        original = int(key("rope.scaling.original_context_length"))
        scaling = {"rope_type": "longrope", "long_factor": _rope_vector(path, tensors, ROPE_LONG, rotary_dim),
                   "short_factor": _rope_vector(path, tensors, ROPE_SHORT, rotary_dim),
                   "original_max_position_embeddings": original,
                   "factor": int(key("context_length")) / original}
        # the converter writes transformers' attention factor, computed as transformers does
        attention_factor = key("rope.scaling.attn_factor", None)
        return scaling if attention_factor is None else scaling | {"attention_factor": float(attention_factor)}
    kind = key("rope.scaling.type", None)
    if kind in (None, "none"):
        return None
    if kind not in ("linear", "yarn"):
        raise ModelLoadError(f"{path}: its {header.architecture} model's rope scaling {kind!r} "
                             f"({header.architecture}.rope.scaling.type) is not supported; Tally reads linear and yarn "
                             "(and LongRoPE's and Llama 3.1's factor tensors)")
    if kind == "yarn":
        return yarn_scaling(key)
    scaling = {"rope_type": kind, "factor": float(key("rope.scaling.factor", 1.0))}
    original = key("rope.scaling.original_context_length", None)
    if original is not None:
        scaling["original_max_position_embeddings"] = int(original)
    return scaling


def _rope_vector(path: Path, tensors: dict[str, TensorInfo], name: str, rotary_dim: int) -> list[float]:
    """The tensor `name`: one F32 value per rotary pair, read from the file."""
    pairs, info = rotary_dim // 2, tensors.get(name)
    if info is None or info.ggml_type != GGMLQuantizationType.F32 or info.shape != (pairs,):
        found = "missing" if info is None else f"{info.ggml_type.name} of shape {list(info.shape)}"
        raise ModelLoadError(f"{path}: {name} should be {pairs} F32 values (one per rotary pair), but it is "
                             f"{found}; re-convert the model")
    with open(path, "rb") as f:
        f.seek(info.offset)
        return np.frombuffer(f.read(info.nbytes), dtype=np.float32).tolist()


def _torch_dtype(tensors: list[TensorInfo]) -> str:
    """float32 when anything is quantized (we dequantize to it); else the half type the weights use."""
    types = {t.ggml_type for t in tensors}
    F32, F16, BF16 = GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16
    if not types <= {F32, F16, BF16}:
        return "float32"
    return "bfloat16" if BF16 in types else "float16" if F16 in types else "float32"
