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

from tally.ledger.weights import WeightTensor
from tally.models.config import ModelConfig
from tally.models.gguf_header import gguf_config, read_header

# GGUF tensor name suffix -> (role, TP split, is a K/V projection)
_ROLES = {
    "attn_q": ("linear", "rows", False), "attn_k": ("linear", "rows", True), "attn_v": ("linear", "rows", True),
    "attn_qkv": ("linear", "rows", False), "attn_output": ("linear", "cols", False),
    "ffn_gate": ("linear", "rows", False), "ffn_up": ("linear", "rows", False), "ffn_down": ("linear", "cols", False),
    "ffn_gate_inp": ("linear", None, False), "ffn_gate_exps": ("linear", "rows", False),
    "ffn_up_exps": ("linear", "rows", False), "ffn_down_exps": ("linear", "cols", False),
    "attn_sinks": ("bias", "rows", False),  # GPT-OSS: a logit per query head, counted as model_tensors counts it
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
    config = gguf_config(header, path)
    tensors, types = [], {}
    for info in header.tensors:
        type_name = info.ggml_type.name
        types[type_name] = types.get(type_name, 0) + 1
        tensors.append(_tensor(info.name, info.shape, ggml_type_bytes(type_name, prod(info.shape))))
    data_offset = min((info.offset for info in header.tensors), default=path.stat().st_size)
    return GGUFModel(
        name=str(header.metadata.get("general.name") or path.stem),
        config=config,
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
