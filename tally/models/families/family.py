"""What a model family declares: the names it goes by in HF and GGUF files, how its config reads into Tally's
traits (tally/models/config.py), and how its checkpoint's tensor names map onto Tally's."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tally.models.config import ModelConfig
from tally.models.families.gguf_fields import GGUFKey

# Tally names a layer's tensors as Llama's HF checkpoints do, plus what Llama lacks: `attn_output_norm` and
# `mlp_output_norm` (norms of a block's output before the residual add), `mlp.gate` (the router),
# `mlp.experts.{e}.{gate,up,down}_proj` (each with a bias where the experts have them) and `self_attn.sinks`.


@dataclass(frozen=True)
class Relaid:
    """One of Tally's tensors inside a stored tensor laid out otherwise (GPT-OSS's experts: stacked, transposed,
    gate and up interleaved): the stored rows (first axis) it comes from and what turns them into it."""

    name: str  # Tally's name after `model.layers.{i}.`
    rows: slice
    shape: tuple[int, ...]  # after `take`
    take: Callable[[Any], Any]  # the stored rows (a torch.Tensor) -> Tally's tensor


def same_name(name: str) -> str:
    return name


def no_traits(key: GGUFKey, names: set[str]) -> dict[str, Any]:
    return {}


def not_relaid(name: str, shape: tuple[int, ...]) -> list[Relaid]:
    return []


@dataclass(frozen=True)
class Family:
    name: str  # what Tally calls it (ModelConfig.architecture)
    hf_architectures: tuple[str, ...]  # config.json's `architectures`
    gguf_architectures: tuple[str, ...]  # a GGUF's `general.architecture`
    config_from_hf: Callable[[dict[str, Any]], ModelConfig]
    # the traits a GGUF's metadata carries (or llama.cpp fixes per architecture) beyond the shape every family
    # shares (tally/models/gguf_header.py): (metadata reader by key without the `{arch}.` prefix, tensor names) ->
    # ModelConfig fields
    traits_from_gguf: Callable[[GGUFKey, set[str]], dict[str, Any]] = no_traits
    hf_rename: Callable[[str], str] = same_name  # a layer tensor's name after `model.layers.{i}.` -> Tally's
    # a layer tensor holding several of Tally's tensors' rows, in order (Phi-3's qkv_proj, gate_up_proj)
    hf_fused: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # a layer tensor (name after `model.layers.{i}.`, shape) -> Tally's tensors it holds otherwise laid out ([]: none)
    hf_relaid: Callable[[str, tuple[int, ...]], list[Relaid]] = not_relaid
    hf_norm_plus_one: bool = False  # the HF file stores w where the norm scales by 1 + w (GGUF stores 1 + w)
    # a layer tensor's GGUF name after `blk.{i}.` -> Tally's, where it is not Llama's (tally/models/gguf_checkpoint.py)
    gguf_names: dict[str, str] = field(default_factory=dict)
    gguf_fused: dict[str, tuple[str, ...]] = field(default_factory=dict)  # as hf_fused, by GGUF name
    gguf_rope_permuted: bool = False  # convert_hf_to_gguf interleaved q/k rows' rotary halves (undone on load)
