"""Hugging Face checkpoints: config.json + model.safetensors (or shards listed in
model.safetensors.index.json). Also the HF tensor names and shapes every loader checks against."""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from itertools import groupby
from operator import itemgetter
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from tally.errors import ModelLoadError
from tally.models.config import ModelConfig
from tally.progress import Track

LOADING = "Loading safetensors tensors"  # the load progress bar's words (vLLM: "Loading safetensors checkpoint shards")
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_FLOAT_DTYPES = {"F32", "F16", "BF16"}
# Tensors some checkpoints carry that the model recomputes or does not need.
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


def expected_tensor_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the model needs, by HF name, with its HF shape ([out, in] for linears)."""
    h, i, v = config.hidden_size, config.intermediate_size, config.vocab_size
    q, kv = config.q_size, config.kv_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (v, h)
    for layer in range(config.num_layers):
        p = f"model.layers.{layer}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
        }
        if config.attention_bias:
            shapes |= {p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                       p + "self_attn.v_proj.bias": (kv,)}
        if config.qk_norm:
            shapes |= {p + "self_attn.q_norm.weight": (config.head_dim,),
                       p + "self_attn.k_norm.weight": (config.head_dim,)}
    return shapes


def check_tensor_shapes(found: dict[str, tuple[int, ...]], config: ModelConfig, where: str) -> None:
    """Missing, misshapen or unexpected tensors → ModelLoadError naming them (`where` is the file)."""
    expected = expected_tensor_shapes(config)
    missing = [name for name in expected if name not in found]
    if missing:
        raise ModelLoadError(
            f"{where} is missing {len(missing)} tensor(s) a {config.architecture} model with "
            f"{config.num_layers} layers needs: {_first(missing)}"
        )
    for name, shape in expected.items():
        if tuple(found[name]) != shape:
            raise ModelLoadError(
                f"{where}: tensor {name} has shape {list(found[name])} but the config implies {list(shape)}; "
                "the config and the weights disagree"
            )
    unexpected = [n for n in found if n not in expected and not _ignorable(n, config)]
    if unexpected:
        raise ModelLoadError(
            f"{where} holds {len(unexpected)} tensor(s) Tally's {config.architecture} model has no place for "
            f"({_first(unexpected)}); serving without them would give wrong outputs"
        )


def _ignorable(name: str, config: ModelConfig) -> bool:
    # Tied checkpoints sometimes still store the (identical) lm_head.
    return name.endswith(_IGNORED_SUFFIXES) or (name == "lm_head.weight" and config.tie_word_embeddings)


def _first(names: list[str], count: int = 5) -> str:
    more = f", ... ({len(names) - count} more)" if len(names) > count else ""
    return ", ".join(names[:count]) + more


class HFTensorSource:
    """Streams the tensors of a checkpoint directory, one safetensors file open at a time."""

    def __init__(self, order: list[tuple[Path, str]]) -> None:
        self._order = order  # (file, tensor name) of every tensor the model takes, file by file

    def tensors(self, track: Track) -> Iterator[tuple[str, torch.Tensor]]:
        for file, names in groupby(track(self._order, LOADING), key=itemgetter(0)):
            with safe_open(str(file), framework="pt") as f:
                for _, name in names:
                    yield name, f.get_tensor(name)


def open_hf(path: Path) -> tuple[ModelConfig, HFTensorSource]:
    """Parse config.json (+ generation_config.json eos ids) and check every safetensors header."""
    config = ModelConfig.from_json_file(path / "config.json")
    config = dataclasses.replace(config, eos_token_ids=merged_eos_ids(config, path))
    files, weight_map = weight_files(path)
    wanted = set(expected_tensor_shapes(config))
    found: dict[str, tuple[int, ...]] = {}
    order: list[tuple[Path, str]] = []
    for file in files:
        header = read_header(file)
        order += [(file, name) for name in header if name in wanted]
        for name, file_name in (weight_map or {}).items():
            if file_name == file.name and name not in header:
                raise ModelLoadError(f"{path / INDEX_FILE} says {name} is in {file.name}, but that shard lacks it")
        for name, (shape, dtype) in header.items():
            if dtype not in _FLOAT_DTYPES and name in wanted:
                raise ModelLoadError(
                    f"{file}: tensor {name} is stored as {dtype}; Tally loads float checkpoints "
                    "(F32/F16/BF16); quantize with `tally quantize` instead"
                )
            found[name] = shape
    check_tensor_shapes(found, config, str(path))
    return config, HFTensorSource(order)


def weight_files(path: Path) -> tuple[list[Path], dict[str, str] | None]:
    """The safetensors files to read, and the index's {tensor: shard} map when sharded."""
    if (path / SINGLE_FILE).is_file():
        return [path / SINGLE_FILE], None
    index_path = path / INDEX_FILE
    if not index_path.is_file():
        raise ModelLoadError(f"{path} has config.json but neither {SINGLE_FILE} nor {INDEX_FILE}")
    try:
        weight_map = json.loads(index_path.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"{index_path} is not a valid safetensors index (needs a weight_map): {exc}") from exc
    files = [path / name for name in dict.fromkeys(weight_map.values())]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ModelLoadError(f"{index_path} lists shard(s) that are not in {path}: {_first(missing)}")
    return files, weight_map


def read_header(file: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """{name: (shape, dtype)} from the header alone; safetensors checks the file covers every tensor."""
    try:
        with safe_open(str(file), framework="pt") as f:
            return {name: (tuple(f.get_slice(name).get_shape()), f.get_slice(name).get_dtype())
                    for name in f.keys()}
    except SafetensorError as exc:
        raise ModelLoadError(f"{file} is corrupt or truncated ({exc}); re-download or re-save it") from exc


def merged_eos_ids(config: ModelConfig, path: Path) -> tuple[int, ...]:
    """config.json's eos ids, then generation_config.json's (chat models often list more there)."""
    gen_path = path / "generation_config.json"
    if not gen_path.is_file():
        return config.eos_token_ids
    try:
        eos = json.loads(gen_path.read_text()).get("eos_token_id")
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{gen_path} is not valid JSON: {exc}") from exc
    extra = eos if isinstance(eos, list) else ([] if eos is None else [eos])
    return tuple(dict.fromkeys([*config.eos_token_ids, *(int(e) for e in extra)]))
