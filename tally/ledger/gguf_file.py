"""A GGUF file's shape and tensor table, read from its header (the weights are never loaded).

Each tensor is priced at its real ggml type size from the `gguf` package's table
(Q4_1: 20 bytes per 32 values, Q8_0: 34 per 32, Q4_K: 144 per 256, Q6_K: 210 per 256, F32: 4 per 1).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from math import prod
from pathlib import Path

import gguf

from tally.errors import ModelLoadError
from tally.ledger.weights import WeightTensor
from tally.models.config import ModelConfig
from tally.models.gguf_header import read_header

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
    block_values, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
    return -(-numel // block_values) * block_bytes


def read_gguf(path: str | Path) -> GGUFModel:
    path = Path(path)
    header = read_header(path)  # the loader's torch-free reader: one parser of the format
    meta, arch = header.metadata, header.architecture
    if arch not in _ARCHITECTURES:
        raise ModelLoadError(f"{path.name}: GGUF architecture {arch!r} is not one Tally plans for "
                             f"({', '.join(sorted(_ARCHITECTURES))})")
    tensors, types = [], {}
    for info in header.tensors:
        type_name = info.ggml_type.name
        types[type_name] = types.get(type_name, 0) + 1
        tensors.append(_tensor(info.name, info.shape, ggml_type_bytes(type_name, prod(info.shape))))
    data_offset = min((info.offset for info in header.tensors), default=path.stat().st_size)
    return GGUFModel(
        name=str(meta.get("general.name") or path.stem),
        config=_config(meta, arch, {info.name for info in header.tensors}),
        tensors=tensors,
        tensor_types=types,
        tensor_data_bytes=path.stat().st_size - data_offset,
    )


def _tensor(name: str, shape: tuple[int, ...], stored_bytes: int) -> WeightTensor:
    """`shape` in torch order: output rows first, input features last."""
    rows, cols = (prod(shape[:-1]), shape[-1]) if len(shape) > 1 else (shape[0], 1)
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


def _config(meta: dict, arch: str, tensor_names: set[str]) -> ModelConfig:
    def key(name: str, default=None):
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise ModelLoadError(f"GGUF metadata lacks {arch}.{name}; cannot plan this file")
        return value

    hidden, heads = int(key("embedding_length")), int(key("attention.head_count"))
    vocab = meta.get("tokenizer.ggml.tokens") or key("vocab_size")  # the reader gives string arrays as a count
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
        tie_word_embeddings="output.weight" not in tensor_names,
        attention_bias="blk.0.attn_q.bias" in tensor_names,
        qk_norm="blk.0.attn_q_norm.weight" in tensor_names,
    )
