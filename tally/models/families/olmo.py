"""OLMo 2 (norms after each block, q/k norms over the whole projection) and OLMoE (the same q/k norms, pre-norms,
experts)."""
from __future__ import annotations

from typing import Any

from tally.errors import ModelLoadError
from tally.models.config import Experts, ModelConfig
from tally.models.families import gguf_fields
from tally.models.families.family import Family
from tally.models.families.hf_fields import activation, shape_fields

_NAMES = {"post_attention_layernorm": "attn_output_norm", "post_feedforward_layernorm": "mlp_output_norm"}


def _rename(name: str) -> str:
    module, _, rest = name.partition(".")
    return f"{_NAMES.get(module, module)}.{rest}"


def _olmo2(cfg: dict[str, Any]) -> ModelConfig:
    return ModelConfig(**shape_fields(cfg, "olmo2"), activation=activation(cfg, "olmo2"), norm_layout="post",
                       norm_scale_in_float=True, qk_norm="projection")


def _olmoe(cfg: dict[str, Any]) -> ModelConfig:
    if cfg.get("clip_qkv") is not None:
        raise ModelLoadError(f"this olmoe model clips q/k/v (config.json clip_qkv={cfg['clip_qkv']}), which Tally "
                             "does not support; it supports clip_qkv null")
    count = cfg.get("num_experts") or cfg["num_local_experts"]
    experts = Experts(num_experts=int(count), top_k=int(cfg["num_experts_per_tok"]),
                      intermediate_size=int(cfg["intermediate_size"]),
                      normalize_top_k=bool(cfg.get("norm_topk_prob", False)))
    return ModelConfig(**shape_fields(cfg, "olmoe"), activation=activation(cfg, "olmoe"), qk_norm="projection",
                       experts=experts)


def _olmo2_gguf(key: gguf_fields.GGUFKey, names: set[str]) -> dict[str, Any]:
    return dict(norm_layout="post", norm_scale_in_float=True)  # q/k norms over the projection: by their shape


def _olmoe_gguf(key: gguf_fields.GGUFKey, names: set[str]) -> dict[str, Any]:
    # llama.cpp keeps the chosen experts' softmax weights unnormalised here, as OLMoE's configs (norm_topk_prob)
    return gguf_fields.experts(key, normalize_top_k=False)


OLMO2 = Family("olmo2", ("Olmo2ForCausalLM",), ("olmo2",), _olmo2, _olmo2_gguf, hf_rename=_rename,
               gguf_names=gguf_fields.OUTPUT_NORM_NAMES)
OLMOE = Family("olmoe", ("OlmoeForCausalLM",), ("olmoe",), _olmoe, _olmoe_gguf)
