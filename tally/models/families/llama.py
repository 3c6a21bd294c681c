"""Llama (2, 3.0-3.3 with llama3 rope scaling) and Mistral: the layer every other family varies. Ministral
(MinistralForCausalLM) is Mistral's layer with sliding and full layers named per layer (`layer_types`), which
Mistral's mapping reads."""
from __future__ import annotations

from typing import Any

from tally.models.config import ModelConfig
from tally.models.families import gguf_fields
from tally.models.families.family import Family
from tally.models.families.hf_fields import activation, shape_fields, windows


def _llama(cfg: dict[str, Any]) -> ModelConfig:
    fields = shape_fields(cfg, "llama")
    return ModelConfig(**fields, activation=activation(cfg, "llama"))


def _mistral(cfg: dict[str, Any]) -> ModelConfig:
    fields = shape_fields(cfg, "mistral")
    fields |= windows(cfg, fields["num_layers"], cfg.get("sliding_window"))
    return ModelConfig(**fields, activation=activation(cfg, "mistral"))


def _llama_gguf(key: gguf_fields.GGUFKey, names: set[str]) -> dict[str, Any]:
    # llama.cpp writes Llama, Mistral and Mixtral alike as "llama" (and keeps no sliding window); experts make it
    # Mixtral, whose chosen experts' weights llama.cpp renormalises, as transformers does
    moe = gguf_fields.experts(key, normalize_top_k=True)
    return moe | {"architecture": "mixtral"} if moe else {}


LLAMA = Family("llama", ("LlamaForCausalLM",), ("llama",), _llama, _llama_gguf, gguf_rope_permuted=True)
MISTRAL = Family("mistral", ("MistralForCausalLM", "MinistralForCausalLM"), ("mistral",), _mistral,
                 gguf_rope_permuted=True)
