"""Llama (2, 3.0-3.3 with llama3 rope scaling) and Mistral: the layer every other family varies."""
from __future__ import annotations

from typing import Any

from tally.models.config import ModelConfig
from tally.models.families.family import Family
from tally.models.families.hf_fields import activation, shape_fields, windows


def _llama(cfg: dict[str, Any]) -> ModelConfig:
    fields = shape_fields(cfg, "llama")
    return ModelConfig(**fields, activation=activation(cfg, "llama"))


def _mistral(cfg: dict[str, Any]) -> ModelConfig:
    fields = shape_fields(cfg, "mistral")
    fields |= windows(cfg, fields["num_layers"], cfg.get("sliding_window"))
    return ModelConfig(**fields, activation=activation(cfg, "mistral"))


LLAMA = Family("llama", ("LlamaForCausalLM",), ("llama",), _llama, gguf_rope_permuted=True)
MISTRAL = Family("mistral", ("MistralForCausalLM",), ("mistral",), _mistral, gguf_rope_permuted=True)
