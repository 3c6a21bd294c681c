"""GGUF checkpoints (llama.cpp's format): tensors under Tally's names (llama.cpp's names, the family's own, fused
tensors and experts split by rows), dequantized with gguf.quants, and llama.cpp's Q/K row permutation undone."""
from __future__ import annotations

import logging
import mmap
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from math import prod
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from tally.errors import ModelLoadError
from tally.models.checkpoint_names import StoredPart, fused_parts, part_shape
from tally.models.config import ModelConfig
from tally.models.families import Family, family
from tally.models.gguf_header import ROPE_TENSORS, TensorInfo, gguf_config, read_header
from tally.models.hf_checkpoint import check_tensor_shapes, expected_tensor_shapes
from tally.progress import Track
from tally.quant.gguf_blocks import NATIVE_BLOCK_TYPES

GGUF_LOADING = "Loading GGUF tensors"  # the load progress bar's words, as safetensors' (hf_checkpoint.LOADING)
_FLOAT_TYPES = {Q.F32: torch.float32, Q.F16: torch.float16, Q.BF16: torch.bfloat16}
# every block type gguf.quants dequantizes; those without a native kernel (NATIVE_BLOCK_TYPES) are served dequantized
_QUANTIZED_TYPES = {Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_NL,
                    Q.IQ4_XS, Q.MXFP4, Q.IQ1_S, Q.IQ1_M, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S, Q.TQ1_0,
                    Q.TQ2_0}
log = logging.getLogger(__name__)

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# llama.cpp's names of a layer's tensors (after `blk.{i}.`) -> Tally's (after `model.layers.{i}.`)
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "ffn_gate_inp.weight": "mlp.gate.weight",
}
# every expert's projection in one [experts, out, in] tensor (its biases in one [experts, out], GPT-OSS) -> each
# expert's name after `mlp.experts.{e}.`
_EXPERT_NAMES = {f"ffn_{theirs}_exps.{kind}": f"{ours}_proj.{kind}" for theirs, ours in
                 (("gate", "gate"), ("up", "up"), ("down", "down")) for kind in ("weight", "bias")}
_LAYER_PREFIX = "model.layers."


@dataclass(frozen=True)
class GGUFRawTensor:
    """One tensor's bytes as stored (q/k rows already un-permuted), for quantized layers to adopt."""

    ggml_type: Q
    shape: tuple[int, ...]  # HF order: [out, in] for linears
    data: np.ndarray  # uint8, [*shape[:-1], bytes per row]; read-only view of the file unless re-ordered


def stored_parts(info: TensorInfo, fam: Family, expected: dict[str, tuple[int, ...]]) -> list[StoredPart]:
    """The part(s) of Tally's tensors a GGUF tensor holds, as rows of the tensor seen as [rows, last axis]: a fused
    tensor's parts one after another (Phi-3's attn_qkv), an expert tensor's experts one after another. Names
    Tally does not know come back unchanged (and fail the shape check)."""
    name = info.name
    if name in _GLOBAL_NAMES:
        return [StoredPart(_GLOBAL_NAMES[name], name)]
    blk, _, rest = name.partition(".")
    layer, _, rest = rest.partition(".")
    if blk != "blk" or not layer.isdigit():
        return [StoredPart(name, name)]
    prefix = f"{_LAYER_PREFIX}{layer}."
    if rest in fam.gguf_fused:
        return fused_parts(name, info.shape, [prefix + part for part in fam.gguf_fused[rest]], expected)
    if rest in _EXPERT_NAMES and len(info.shape) == 3:
        count, rows = info.shape[:2]
        return [StoredPart(f"{prefix}mlp.experts.{e}.{_EXPERT_NAMES[rest]}", name, slice(e * rows, (e + 1) * rows))
                for e in range(count)]
    if rest in _EXPERT_NAMES and len(info.shape) == 2:  # biases: one row each
        return [StoredPart(f"{prefix}mlp.experts.{e}.{_EXPERT_NAMES[rest]}", name, slice(e, e + 1),
                           shape=info.shape[1:]) for e in range(info.shape[0])]
    ours = fam.gguf_names.get(rest) or LAYER_NAMES.get(rest)
    return [StoredPart(prefix + ours if ours else name, name)]


def gguf_name(name: str, fam: Family) -> str:
    """The GGUF tensor that holds Tally's tensor `name` (for messages)."""
    if not name.startswith(_LAYER_PREFIX):
        return {ours: stored for stored, ours in _GLOBAL_NAMES.items()}.get(name, name)
    layer, _, rest = name.removeprefix(_LAYER_PREFIX).partition(".")
    expert = re.fullmatch(r"mlp\.experts\.\d+\.(.+)", rest)
    fused = [stored for stored, parts in fam.gguf_fused.items() if rest in parts]
    if expert:
        stored = {ours: stored for stored, ours in _EXPERT_NAMES.items()}[expert.group(1)]
    else:
        stored = fused[0] if fused else {ours: s for s, ours in (LAYER_NAMES | fam.gguf_names).items()}.get(rest, rest)
    return f"blk.{layer}.{stored}"


def _as_rows(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A tensor's shape with every axis but the last as rows: [experts, out, in] -> [experts * out, in]."""
    return shape if len(shape) < 3 else (prod(shape[:-1]), shape[-1])


class GGUFTensorSource:
    """Streams a GGUF file's tensors under Tally's names, dequantizing one tensor at a time."""

    def __init__(self, path: Path, parts: dict[str, tuple[TensorInfo, StoredPart]], config: ModelConfig) -> None:
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._blob = np.frombuffer(self._map, dtype=np.uint8)
        self._parts = parts  # Tally's name -> (the GGUF tensor holding it, which part of it)
        self._row_order = unpermute_orders(config) if family(config.architecture).gguf_rope_permuted else {}

    def tensors(self, track: Track) -> Iterator[tuple[str, torch.Tensor]]:
        # no "dequantizing" in the words: a quantized layer serves the stored blocks, not this float copy
        for name in track(self.names(), GGUF_LOADING):
            yield name, self.read(name)

    def names(self) -> list[str]:
        return list(self._parts)

    def read(self, name: str) -> torch.Tensor:
        """One tensor as floats (dequantized from its blocks)."""
        raw = self.raw(name)
        return tensor_values(raw.ggml_type, raw.data).reshape(raw.shape)

    def raw(self, name: str) -> GGUFRawTensor | None:
        found = self._parts.get(name)
        if found is None:
            return None
        info, part = found
        # First axis: output rows of a linear (of every expert, one after another), elements of a vector.
        shape = _as_rows(info.shape)
        data = self._blob[info.offset: info.offset + info.nbytes].reshape(shape[0], -1)
        if part.rows is not None:  # whole rows: quantized blocks stay intact
            data, shape = data[part.rows], part_shape(part, shape)
        order = self._row_order.get(name.split(".")[-2])
        if order is not None:
            data = data[order]
        return GGUFRawTensor(info.ggml_type, shape, data.reshape(*shape[:-1], -1))


def tensor_values(ggml_type: Q, data: np.ndarray) -> torch.Tensor:
    """A tensor's stored bytes ([..., bytes per row]) as floats: a float type as stored, a block type dequantized."""
    if ggml_type in _FLOAT_TYPES:
        # numpy has no bfloat16, so floats go through torch as bytes and are reinterpreted.
        return torch.from_numpy(data.copy()).view(_FLOAT_TYPES[ggml_type])
    return torch.from_numpy(dequantize(data, ggml_type))


def readable_types() -> str:
    """The stored types tensor_values reads, for messages."""
    return ", ".join(sorted(t.name for t in [*_FLOAT_TYPES, *_QUANTIZED_TYPES]))


def is_readable(ggml_type: Q) -> bool:
    return ggml_type in _FLOAT_TYPES or ggml_type in _QUANTIZED_TYPES


def unpermute_orders(config: ModelConfig) -> dict[str, np.ndarray]:
    """Row orders that undo `w.reshape(n_head, 2, d // n_head // 2, ...).swapaxes(1, 2)` for q and k."""
    def order(rows: int, heads: int) -> np.ndarray:
        return np.arange(rows).reshape(heads, rows // heads // 2, 2).swapaxes(1, 2).reshape(-1)
    return {"q_proj": order(config.q_size, config.num_heads), "k_proj": order(config.kv_size, config.num_kv_heads)}


def open_gguf(path: Path) -> tuple[ModelConfig, GGUFTensorSource]:
    header = read_header(path)
    config = gguf_config(header, path)
    for info in header.tensors:
        if not is_readable(info.ggml_type):
            raise ModelLoadError(
                f"{path}: tensor {info.name} is stored as {info.ggml_type.name}, which Tally cannot "
                f"dequantize; supported types: {readable_types()}"
            )
    dequantized = Counter(t.ggml_type.name for t in header.tensors
                          if t.ggml_type in _QUANTIZED_TYPES and t.ggml_type.name not in NATIVE_BLOCK_TYPES)
    if dequantized:
        kinds = ", ".join(f"{name} ({count} tensors)" for name, count in sorted(dequantized.items()))
        log.warning("%s stores tensors as %s, which Tally has no native kernel for: they are dequantized at load, "
                    "taking more memory and more bytes per token than in the file", path, kinds)
    fam = family(config.architecture)
    expected = expected_tensor_shapes(config)
    found: dict[str, tuple[int, ...]] = {}
    parts: dict[str, tuple[TensorInfo, StoredPart]] = {}
    for info in header.tensors:
        if info.name in ROPE_TENSORS:  # read into the config's rope scaling
            continue
        for part in stored_parts(info, fam, expected):
            found[part.name] = part_shape(part, _as_rows(info.shape))
            if part.name in expected:
                parts[part.name] = (info, part)
    check_tensor_shapes(found, config, str(path), lambda name: gguf_name(name, fam))
    return config, GGUFTensorSource(path, parts, config)
