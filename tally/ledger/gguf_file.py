"""A GGUF file's shape and tensor table, read from its header (the weights are never loaded).

Each tensor is priced at its real ggml type size from the `gguf` package's table
(Q4_1: 20 bytes per 32 values, Q8_0: 34 per 32, Q4_K: 144 per 256, Q6_K: 210 per 256, F32: 4 per 1).
"""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tally.errors import ModelLoadError
from tally.ledger.weights import WeightTensor
from tally.models.config import ModelConfig

_ARCHITECTURES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3"}
# GGUF tensor name suffix -> (role, TP split, is a K/V projection)
_ROLES = {
    "attn_q": ("linear", "rows", False), "attn_k": ("linear", "rows", True), "attn_v": ("linear", "rows", True),
    "attn_output": ("linear", "cols", False), "ffn_gate": ("linear", "rows", False),
    "ffn_up": ("linear", "rows", False), "ffn_down": ("linear", "cols", False),
}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


@dataclass(frozen=True)
class GGUFModel:
    name: str
    config: ModelConfig
    tensors: list[WeightTensor]
    tensor_types: dict[str, int]  # ggml type name -> number of tensors stored with it
    tensor_data_bytes: int  # file size minus the header: what the tensors occupy on disk


def ggml_type_bytes(type_name: str, numel: int) -> int:
    """Bytes of `numel` values stored as ggml type `type_name` (whole blocks)."""
    import gguf

    block_values, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
    return -(-numel // block_values) * block_bytes


def read_gguf(path: str | Path) -> GGUFModel:
    path = Path(path)
    try:
        with open(path, "rb") as f:
            header = _read_header(f)
    except (OSError, ValueError, struct.error, KeyError) as exc:
        raise ModelLoadError(f"{path} is not a readable GGUF file: {exc}") from exc
    meta = header.metadata
    arch = str(meta.get("general.architecture", "?"))
    if arch not in _ARCHITECTURES:
        raise ModelLoadError(f"{path.name}: GGUF architecture {arch!r} is not one Tally plans for "
                             f"({', '.join(sorted(_ARCHITECTURES))})")
    tensors, types = [], {}
    for name, shape, type_name in header.tensors:
        types[type_name] = types.get(type_name, 0) + 1
        numel = 1
        for dim in shape:
            numel *= dim
        tensors.append(_tensor(name, shape, ggml_type_bytes(type_name, numel)))
    vocab = meta.get(f"{arch}.vocab_size") or header.array_lengths.get("tokenizer.ggml.tokens")
    tied = "output.weight" not in {name for name, _, _ in header.tensors}
    return GGUFModel(
        name=str(meta.get("general.name") or path.stem),
        config=_config(meta, arch, vocab, tied=tied),
        tensors=tensors,
        tensor_types=types,
        tensor_data_bytes=path.stat().st_size - header.data_offset,
    )


@dataclass
class _Header:
    metadata: dict[str, object]  # scalar and string values
    array_lengths: dict[str, int]  # arrays are skipped, only their length kept
    tensors: list[tuple[str, list[int], str]]  # name, shape (ggml order), ggml type name
    data_offset: int


# GGUF value types: id -> struct format of one scalar ("s" string, "a" array)
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 8: "s", 9: "a", 10: "Q", 11: "q", 12: "d"}


def _read_header(f: BinaryIO) -> _Header:
    """A small sequential parser: the `gguf` package's reader builds a numpy view per token string
    and takes ~10 s on a 49k-token vocabulary; this reads the same header in well under a second."""
    import gguf

    def unpack(fmt: str):
        return struct.unpack("<" + fmt, f.read(struct.calcsize(fmt)))[0]

    def string() -> str:
        return f.read(unpack("Q")).decode("utf-8", errors="replace")

    def value(kind: int):
        fmt = _SCALAR[kind]
        return string() if fmt == "s" else unpack(fmt)

    if f.read(4) != b"GGUF":
        raise ValueError("bad magic (not a GGUF file)")
    version = unpack("I")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} is not supported (2 or 3)")
    tensor_count, kv_count = unpack("Q"), unpack("Q")
    metadata, array_lengths = {}, {}
    for _ in range(kv_count):
        key, kind = string(), unpack("I")
        if _SCALAR[kind] != "a":
            metadata[key] = value(kind)
            continue
        item_kind, count = unpack("I"), unpack("Q")
        array_lengths[key] = count
        if _SCALAR[item_kind] == "s":
            for _ in range(count):
                f.seek(unpack("Q"), 1)
        else:
            f.seek(count * struct.calcsize(_SCALAR[item_kind]), 1)
    tensors = []
    for _ in range(tensor_count):
        name = string()
        shape = [unpack("Q") for _ in range(unpack("I"))]
        type_name = gguf.GGMLQuantizationType(unpack("I")).name
        unpack("Q")  # offset within the data section; sizes come from the type table
        tensors.append((name, shape, type_name))
    alignment = int(metadata.get("general.alignment", 32))
    data_offset = -(-f.tell() // alignment) * alignment
    return _Header(metadata, array_lengths, tensors, data_offset)


def _tensor(name: str, shape: list[int], stored_bytes: int) -> WeightTensor:
    cols = shape[0]  # ggml lists the fastest dimension (input features) first
    rows = 1
    for dim in shape[1:]:
        rows *= dim
    if len(shape) == 1:
        rows, cols = cols, 1
    match = _BLOCK.fullmatch(name)
    if match:
        layer, kind, part = int(match.group(1)), match.group(2), match.group(3)
        role, split, is_kv = _ROLES.get(kind, ("norm", None, False))
        if part == "bias":
            role = "bias"
        return WeightTensor(name, rows, cols, role, layer, split, is_kv, stored_bytes)
    role = {"token_embd.weight": "embedding", "output.weight": "lm_head"}.get(name, "norm")
    split = "rows" if role != "norm" else None
    return WeightTensor(name, rows, cols, role, None, split, False, stored_bytes)


def _config(meta: dict, arch: str, vocab: int | None, *, tied: bool) -> ModelConfig:
    def key(name: str, default=None):
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise ModelLoadError(f"GGUF metadata lacks {arch}.{name}; cannot plan this file")
        return value

    hidden, heads = int(key("embedding_length")), int(key("attention.head_count"))
    if not vocab:
        raise ModelLoadError(f"GGUF metadata has neither {arch}.vocab_size nor tokenizer.ggml.tokens")
    head_dim = meta.get(f"{arch}.attention.key_length") or meta.get(f"{arch}.rope.dimension_count")
    return ModelConfig(
        architecture=_ARCHITECTURES[arch],
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length")),
        num_layers=int(key("block_count")),
        num_heads=heads,
        num_kv_heads=int(key("attention.head_count_kv", heads)),
        head_dim=int(head_dim or hidden // heads),
        max_position_embeddings=int(key("context_length", 4096)),
        tie_word_embeddings=tied,
        attention_bias=arch == "qwen2",
        qk_norm=arch == "qwen3",
    )
