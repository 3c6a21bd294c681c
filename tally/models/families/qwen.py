"""Qwen2 (q/k/v biases), Qwen3 (q/k norms per head) and Qwen3-MoE (Qwen3's attention over experts)."""
from __future__ import annotations

from typing import Any

from tally.models.config import Experts, ModelConfig
from tally.models.families import gguf_fields
from tally.models.families.family import Family
from tally.models.families.hf_fields import activation, shape_fields, windows


def _fields(cfg: dict[str, Any], family: str) -> dict[str, Any]:
    fields = shape_fields(cfg, family)
    # Qwen configs carry a sliding_window value but use it only with use_sliding_window
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window") else None
    return fields | windows(cfg, fields["num_layers"], window) | {"activation": activation(cfg, family)}


def _qwen2(cfg: dict[str, Any]) -> ModelConfig:
    return ModelConfig(**_fields(cfg, "qwen2") | {"attention_bias": bool(cfg.get("attention_bias", True))})


def _qwen3(cfg: dict[str, Any]) -> ModelConfig:
    return ModelConfig(**_fields(cfg, "qwen3"), qk_norm="head")


def _qwen3_moe(cfg: dict[str, Any]) -> ModelConfig:
    fields = _fields(cfg, "qwen3_moe")
    step = int(cfg.get("decoder_sparse_step", 1))
    count = cfg.get("num_experts") or cfg["num_local_experts"]
    dense = tuple(i for i in range(fields["num_layers"])
                  if i in (cfg.get("mlp_only_layers") or ()) or (i + 1) % step)
    experts = Experts(num_experts=int(count), top_k=int(cfg["num_experts_per_tok"]),
                      intermediate_size=int(cfg["moe_intermediate_size"]),
                      normalize_top_k=bool(cfg.get("norm_topk_prob", False)), dense_layers=dense)
    return ModelConfig(**fields, qk_norm="head", experts=experts)


def _qwen3_moe_gguf(key: gguf_fields.GGUFKey, names: set[str]) -> dict[str, Any]:
    # llama.cpp renormalises the chosen experts' weights here, as Qwen3-MoE's configs do (norm_topk_prob)
    return gguf_fields.experts(key, normalize_top_k=True)


QWEN2 = Family("qwen2", ("Qwen2ForCausalLM",), ("qwen2",), _qwen2)
QWEN3 = Family("qwen3", ("Qwen3ForCausalLM",), ("qwen3",), _qwen3)
QWEN3_MOE = Family("qwen3_moe", ("Qwen3MoeForCausalLM",), ("qwen3moe",), _qwen3_moe, _qwen3_moe_gguf)
