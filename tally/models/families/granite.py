"""Granite 3.x: Llama's layer with multipliers on the embedding, the attention scores, each block's output and
the logits."""
from __future__ import annotations

from typing import Any

from tally.models.config import ModelConfig
from tally.models.families.family import Family
from tally.models.families.gguf_fields import GGUFKey, float32_literal
from tally.models.families.hf_fields import activation, shape_fields


def _granite(cfg: dict[str, Any]) -> ModelConfig:
    return ModelConfig(**shape_fields(cfg, "granite"), activation=activation(cfg, "granite"),
                       embedding_multiplier=float(cfg.get("embedding_multiplier", 1.0)),
                       residual_multiplier=float(cfg.get("residual_multiplier", 1.0)),
                       query_scale=float(cfg.get("attention_multiplier", 1.0)),
                       logits_scaling=float(cfg.get("logits_scaling", 1.0)))


def _granite_gguf(key: GGUFKey, names: set[str]) -> dict[str, Any]:
    # llama.cpp divides Granite's logits by logit_scale (its logits_scaling); an absent or zero multiplier is none
    def scale(name: str) -> float | None:
        return float32_literal(key(name)) if key(name, None) else None
    return dict(embedding_multiplier=scale("embedding_scale") or 1.0, query_scale=scale("attention.scale"),
                residual_multiplier=scale("residual_scale") or 1.0, logits_scaling=scale("logit_scale") or 1.0)


GRANITE = Family("granite", ("GraniteForCausalLM",), ("granite",), _granite, _granite_gguf, gguf_rope_permuted=True)
