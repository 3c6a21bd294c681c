"""Hugging Face checkpoints: config.json + model.safetensors (or shards listed in
model.safetensors.index.json). Also the HF tensor names and shapes every loader checks against."""
from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Iterator
from itertools import groupby
from operator import itemgetter
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from tally.errors import ModelLoadError
from tally.models.config import ModelConfig
from tally.models.checkpoint_names import StoredPart, part_shape, tally_parts
from tally.models.families import family, read_hf_config
from tally.models.families.multimodal import is_multimodal, text_tensor_name
from tally.progress import Track

LOADING = "Loading safetensors tensors"  # the load progress bar's words (vLLM: "Loading safetensors checkpoint shards")
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_FLOAT_DTYPES = {"F32", "F16", "BF16"}
# Tensors some checkpoints carry that the model recomputes or does not need.
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)

log = logging.getLogger(__name__)


def expected_tensor_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the model needs, by Tally's name (tally/models/families/family.py), with its HF shape
    ([out, in] for linears)."""
    h, v = config.hidden_size, config.vocab_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (v, h)
    norms = {"pre": ("input_layernorm", "post_attention_layernorm"), "post": ("attn_output_norm", "mlp_output_norm"),
             "sandwich": ("input_layernorm", "post_attention_layernorm", "attn_output_norm", "mlp_output_norm")}
    for layer in range(config.num_layers):
        p = f"model.layers.{layer}."
        shapes |= {f"{p}{norm}.weight": (h,) for norm in norms[config.norm_layout]}
        shapes |= _attention_shapes(config, p + "self_attn.")
        if config.is_moe_layer(layer):
            e = config.experts
            shapes[p + "mlp.gate.weight"] = (e.num_experts, h)
            if e.bias:
                shapes[p + "mlp.gate.bias"] = (e.num_experts,)
            for expert in range(e.num_experts):
                shapes |= _mlp_shapes(h, e.intermediate_size, f"{p}mlp.experts.{expert}.", e.bias)
        else:
            shapes |= _mlp_shapes(h, config.intermediate_size, p + "mlp.")
    return shapes


def _attention_shapes(config: ModelConfig, p: str) -> dict[str, tuple[int, ...]]:
    h, q, kv = config.hidden_size, config.q_size, config.kv_size
    shapes = {p + "q_proj.weight": (q, h), p + "k_proj.weight": (kv, h), p + "v_proj.weight": (kv, h),
              p + "o_proj.weight": (h, q)}
    if config.attention_bias:
        shapes |= {p + "q_proj.bias": (q,), p + "k_proj.bias": (kv,), p + "v_proj.bias": (kv,)}
    if config.attention_output_bias:
        shapes[p + "o_proj.bias"] = (h,)
    if config.attention_sinks:
        shapes[p + "sinks"] = (config.num_heads,)
    if config.qk_norm == "head":
        shapes |= {p + "q_norm.weight": (config.head_dim,), p + "k_norm.weight": (config.head_dim,)}
    elif config.qk_norm == "projection":
        shapes |= {p + "q_norm.weight": (q,), p + "k_norm.weight": (kv,)}
    return shapes


def _mlp_shapes(h: int, i: int, p: str, bias: bool = False) -> dict[str, tuple[int, ...]]:
    shapes = {p + "gate_proj.weight": (i, h), p + "up_proj.weight": (i, h), p + "down_proj.weight": (h, i)}
    if bias:
        shapes |= {p + "gate_proj.bias": (i,), p + "up_proj.bias": (i,), p + "down_proj.bias": (h,)}
    return shapes


def check_tensor_shapes(found: dict[str, tuple[int, ...]], config: ModelConfig, where: str,
                        stored_name: Callable[[str], str] | None = None) -> None:
    """Missing, misshapen or unexpected tensors → ModelLoadError naming them (`where` is the file;
    `stored_name` gives the file's name of one of Tally's, where the file names it otherwise)."""
    def named(names: list[str]) -> list[str]:
        return [n if stored_name is None or stored_name(n) == n else f"{n} ({stored_name(n)})" for n in names]

    expected = expected_tensor_shapes(config)
    missing = [name for name in expected if name not in found]
    if missing:
        raise ModelLoadError(
            f"{where} is missing {len(missing)} tensor(s) a {config.architecture} model with "
            f"{config.num_layers} layers needs: {_first(named(missing))}"
        )
    for name, shape in expected.items():
        if tuple(found[name]) != shape:
            raise ModelLoadError(
                f"{where}: tensor {named([name])[0]} has shape {list(found[name])} but the config implies "
                f"{list(shape)}; the config and the weights disagree"
            )
    unexpected = [n for n in found if n not in expected and not _ignorable(n, config)]
    if unexpected:
        raise ModelLoadError(
            f"{where} holds {len(unexpected)} tensor(s) Tally's {config.architecture} model has no place for "
            f"({_first(named(unexpected))}); serving without them would give wrong outputs"
        )


def _ignorable(name: str, config: ModelConfig) -> bool:
    # Tied checkpoints sometimes still store the (identical) lm_head.
    return name.endswith(_IGNORED_SUFFIXES) or (name == "lm_head.weight" and config.tie_word_embeddings)


def _first(names: list[str], count: int = 5) -> str:
    more = f", ... ({len(names) - count} more)" if len(names) > count else ""
    return ", ".join(names[:count]) + more


class HFTensorSource:
    """Streams the tensors of a checkpoint directory under Tally's names, one safetensors file open at a time."""

    def __init__(self, order: list[tuple[Path, StoredPart]], norm_plus_one: bool = False) -> None:
        self._order = order  # (file, part) of every tensor the model takes, file by file
        self._norm_plus_one = norm_plus_one

    def tensors(self, track: Track) -> Iterator[tuple[str, torch.Tensor]]:
        for file, parts in groupby(track(self._order, LOADING), key=itemgetter(0)):
            with safe_open(str(file), framework="pt") as f:
                for _, part in parts:
                    tensor = f.get_tensor(part.stored) if part.rows is None else f.get_slice(part.stored)[part.rows]
                    if part.take is not None:
                        tensor = part.take(tensor)
                    if self._norm_plus_one and part.name.endswith("norm.weight"):
                        tensor = tensor.float() + 1.0  # in float32, as the family's norm adds it
                    yield part.name, tensor


def open_hf(path: Path) -> tuple[ModelConfig, HFTensorSource]:
    """Parse config.json (+ generation_config.json eos ids) and check every safetensors header."""
    config = read_hf_config(path / "config.json")
    config = dataclasses.replace(config, eos_token_ids=merged_eos_ids(config, path))
    fam = family(config.architecture)
    files, weight_map = weight_files(path)
    expected = expected_tensor_shapes(config)
    found: dict[str, tuple[int, ...]] = {}
    order: list[tuple[Path, StoredPart]] = []
    text_name = _text_names(path)
    left: list[str] = []
    for file in files:
        header = read_header(file)
        for name, file_name in (weight_map or {}).items():
            if file_name == file.name and name not in header:
                raise ModelLoadError(f"{path / INDEX_FILE} says {name} is in {file.name}, but that shard lacks it")
        for name, (shape, dtype) in header.items():
            if (as_text := text_name(name)) is None:
                left.append(name)
                continue
            for part in tally_parts(as_text, shape, fam, expected):
                part = dataclasses.replace(part, stored=name)
                if part.name in expected and dtype not in _FLOAT_DTYPES:
                    raise ModelLoadError(
                        f"{file}: tensor {name} is stored as {dtype}; Tally loads float checkpoints "
                        "(F32/F16/BF16); quantize with `tally quantize` instead"
                    )
                order += [(file, part)] if part.name in expected else []
                found[part.name] = part_shape(part, shape)
    check_tensor_shapes(found, config, str(path))
    if left:
        log.warning("%s is a multimodal checkpoint: Tally serves its text model and leaves the %d tensors of its "
                    "vision side unread (image inputs are refused)", path, len(left))
    return config, HFTensorSource(order, fam.hf_norm_plus_one)


def _text_names(path: Path) -> Callable[[str], str | None]:
    """A stored tensor's name as the text model stores it (None: not the text model's), for a multimodal
    checkpoint; the name itself otherwise."""
    raw = json.loads((path / "config.json").read_text())
    return text_tensor_name if is_multimodal(raw) else (lambda name: name)


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
