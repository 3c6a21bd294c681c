"""GGUF checkpoints (llama.cpp's format): metadata → ModelConfig, tensors renamed to HF names,
dequantized with gguf.quants, and llama.cpp's Q/K row permutation undone."""
from __future__ import annotations

import mmap
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from tally.errors import ModelLoadError
from tally.models.config import ModelConfig
from tally.models.families import family
from tally.models.gguf_header import GGUFHeader, TensorInfo, gguf_config, read_header
from tally.models.hf_checkpoint import check_tensor_shapes, expected_tensor_shapes
from tally.progress import Track

ROPE_FREQS = "rope_freqs.weight"  # Llama 3.1+: what each rotary frequency is divided by
GGUF_LOADING = "Loading GGUF tensors"  # the load progress bar's words, as safetensors' (hf_checkpoint.LOADING)
_FLOAT_TYPES = {Q.F32: torch.float32, Q.F16: torch.float16, Q.BF16: torch.bfloat16}
_QUANTIZED_TYPES = {Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K}

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
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
}


@dataclass(frozen=True)
class GGUFRawTensor:
    """One tensor's bytes as stored (q/k rows already un-permuted), for quantized layers to adopt."""

    ggml_type: Q
    shape: tuple[int, ...]  # HF order: [out, in] for linears
    data: np.ndarray  # uint8, [*shape[:-1], bytes per row]; read-only view of the file unless re-ordered


def hf_name(gguf_name: str) -> str:
    """The HF name of a GGUF tensor; names we do not know come back unchanged (and fail the check)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    return gguf_name


class GGUFTensorSource:
    """Streams a GGUF file's tensors under HF names, dequantizing one tensor at a time."""

    def __init__(self, path: Path, header: GGUFHeader, config: ModelConfig) -> None:
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._blob = np.frombuffer(self._map, dtype=np.uint8)
        wanted = expected_tensor_shapes(config)
        self._infos = {hf_name(t.name): t for t in header.tensors if hf_name(t.name) in wanted}
        self._row_order = _unpermute_orders(config) if family(config.architecture).gguf_rope_permuted else {}

    def tensors(self, track: Track) -> Iterator[tuple[str, torch.Tensor]]:
        # no "dequantizing" in the words: a quantized layer serves the stored blocks, not this float copy
        for name in track(list(self._infos), GGUF_LOADING):
            raw = self.raw(name)
            if raw.ggml_type in _FLOAT_TYPES:
                # numpy has no bfloat16, so floats go through torch as bytes and are reinterpreted.
                values = torch.from_numpy(raw.data.copy()).view(_FLOAT_TYPES[raw.ggml_type])
            else:
                values = torch.from_numpy(dequantize(raw.data, raw.ggml_type))
            yield name, values.reshape(raw.shape)

    def raw(self, name: str) -> GGUFRawTensor | None:
        info = self._infos.get(name)
        if info is None:
            return None
        # First HF axis: output rows of a linear, elements of a vector.
        rows = self._blob[info.offset: info.offset + info.nbytes].reshape(info.shape[0], -1)
        order = self._row_order.get(name.split(".")[-2])
        if order is not None:  # whole rows move, so quantized blocks stay intact
            rows = rows[order]
        return GGUFRawTensor(info.ggml_type, info.shape, rows.reshape(*info.shape[:-1], -1))


def _unpermute_orders(config: ModelConfig) -> dict[str, np.ndarray]:
    """Row orders that undo `w.reshape(n_head, 2, d // n_head // 2, ...).swapaxes(1, 2)` for q and k."""
    def order(rows: int, heads: int) -> np.ndarray:
        return np.arange(rows).reshape(heads, rows // heads // 2, 2).swapaxes(1, 2).reshape(-1)
    return {"q_proj": order(config.q_size, config.num_heads), "k_proj": order(config.kv_size, config.num_kv_heads)}


def open_gguf(path: Path) -> tuple[ModelConfig, GGUFTensorSource]:
    header = read_header(path)
    config = gguf_config(header, path)
    for info in header.tensors:
        if info.ggml_type not in _FLOAT_TYPES and info.ggml_type not in _QUANTIZED_TYPES:
            supported = ", ".join(sorted(t.name for t in [*_FLOAT_TYPES, *_QUANTIZED_TYPES]))
            raise ModelLoadError(
                f"{path}: tensor {info.name} is stored as {info.ggml_type.name}, which Tally cannot "
                f"dequantize; supported types: {supported}"
            )
    rope_freqs = next((t for t in header.tensors if t.name == ROPE_FREQS), None)
    if rope_freqs is not None:
        config = replace(config, rope_scaling=_rope_divisors(path, rope_freqs, config))
    check_tensor_shapes({hf_name(t.name): t.shape for t in header.tensors if t.name != ROPE_FREQS}, config, str(path))
    return config, GGUFTensorSource(path, header, config)


def _rope_divisors(path: Path, info: TensorInfo, config: ModelConfig) -> dict:
    """Llama 3.1+'s rope scaling as llama.cpp's converter stores it: each rotary frequency's divisor, a tensor."""
    pairs = int(config.head_dim * config.partial_rotary_factor) // 2
    if info.ggml_type != Q.F32 or info.shape != (pairs,):
        raise ModelLoadError(f"{path}: {ROPE_FREQS} should be {pairs} F32 values (one per rotary pair), but it is "
                             f"{info.ggml_type.name} of shape {list(info.shape)}; re-convert the model")
    with open(path, "rb") as f:
        f.seek(info.offset)
        divisors = np.frombuffer(f.read(info.nbytes), dtype=np.float32)
    return {"rope_type": "divisors", "divisors": divisors.tolist()}
