"""Mixtral: Mistral's attention over eight experts, two per token."""
from __future__ import annotations

from typing import Any

from tally.models.config import Experts, ModelConfig
from tally.models.families.family import Family
from tally.models.families.hf_fields import activation, shape_fields, windows

_EXPERT_NAMES = (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj"))


def _rename(name: str) -> str:
    if not name.startswith("block_sparse_moe."):
        return name
    name = "mlp." + name.removeprefix("block_sparse_moe.")
    for theirs, ours in _EXPERT_NAMES:
        name = name.replace(f".{theirs}.", f".{ours}.")
    return name


def _mixtral(cfg: dict[str, Any]) -> ModelConfig:
    fields = shape_fields(cfg, "mixtral")
    fields |= windows(cfg, fields["num_layers"], cfg.get("sliding_window"))
    experts = Experts(num_experts=int(cfg["num_local_experts"]), top_k=int(cfg["num_experts_per_tok"]),
                      intermediate_size=fields["intermediate_size"], normalize_top_k=True)
    return ModelConfig(**fields, activation=activation(cfg, "mixtral"), experts=experts)


# llama.cpp writes Mixtral as a "llama" GGUF with experts: the llama family reads those (llama.py)
MIXTRAL = Family("mixtral", ("MixtralForCausalLM",), (), _mixtral, hf_rename=_rename, gguf_rope_permuted=True)
