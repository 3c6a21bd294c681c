"""Gemma 2 (soft-capped scores and logits, alternating windows) and Gemma 3 text (5 local layers to 1 global,
each kind with its own rotary base, q/k norms): GeGLU, norms before and after each block, scaled embeddings."""
from __future__ import annotations

from typing import Any

from tally.models.config import ModelConfig
from tally.models.families.family import Family
from tally.models.families.gguf_fields import OUTPUT_NORM_NAMES, GGUFKey, float32_literal
from tally.models.families.hf_fields import activation, rope_settings, shape_fields, windows

_NAMES = {"post_attention_layernorm": "attn_output_norm", "pre_feedforward_layernorm": "post_attention_layernorm",
          "post_feedforward_layernorm": "mlp_output_norm"}


def _rename(name: str) -> str:
    module, _, rest = name.partition(".")
    return f"{_NAMES.get(module, module)}.{rest}"


def _fields(cfg: dict[str, Any], family: str, default_types: list[str]) -> dict[str, Any]:
    fields = shape_fields(cfg, family) | {"tie_word_embeddings": bool(cfg.get("tie_word_embeddings", True))}
    cfg = dict(cfg, layer_types=cfg.get("layer_types") or default_types)
    scalar = cfg.get("query_pre_attn_scalar") or fields["head_dim"]
    return fields | windows(cfg, fields["num_layers"], cfg.get("sliding_window")) | dict(
        norm_layout="sandwich", norm_scale_in_float=True, activation=activation(cfg, family),
        query_scale=float(scalar) ** -0.5, embedding_multiplier=fields["hidden_size"] ** 0.5,
        attn_logit_softcap=cfg.get("attn_logit_softcapping"), final_logit_softcap=cfg.get("final_logit_softcapping"))


def _gemma2(cfg: dict[str, Any]) -> ModelConfig:
    layers = int(cfg.get("num_hidden_layers", 0))
    alternate = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    return ModelConfig(**_fields(cfg, "gemma2", alternate))


def _gemma3(cfg: dict[str, Any]) -> ModelConfig:
    layers, pattern = int(cfg.get("num_hidden_layers", 0)), int(cfg.get("sliding_window_pattern", 6))
    five_to_one = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    local_theta, _ = rope_settings(cfg, "gemma3", "sliding_attention")
    local_theta = float(cfg.get("rope_local_base_freq", local_theta))
    return ModelConfig(**_fields(cfg, "gemma3", five_to_one), qk_norm="head", rope_theta_sliding=local_theta)


def _gguf_fields(key: GGUFKey, kinds: list[str], window: int, largest_layers: int) -> dict[str, Any]:
    """What llama.cpp fixes for every Gemma: the layer, each layer's kind (`kinds`, sliding `window` tokens), and
    the score scale: 1/sqrt(head_dim), but 1/sqrt(hidden / heads) for the 27B (`largest_layers` layers), as
    Gemma's own configs set query_pre_attn_scalar (a GGUF does not carry it)."""
    layers, hidden, heads = int(key("block_count")), int(key("embedding_length")), int(key("attention.head_count"))
    scalar = hidden // heads if layers == largest_layers else int(key("attention.key_length", hidden // heads))
    caps = {name: float32_literal(key(name)) if key(name, None) else None
            for name in ("attn_logit_softcapping", "final_logit_softcapping")}
    return dict(norm_layout="sandwich", norm_scale_in_float=True, activation="gelu_tanh", query_scale=scalar ** -0.5,
                embedding_multiplier=hidden ** 0.5, layer_types=tuple(kinds) if "full" in kinds else (),
                sliding_window=window, attn_logit_softcap=caps["attn_logit_softcapping"],
                final_logit_softcap=caps["final_logit_softcapping"])


def _gemma2_gguf(key: GGUFKey, names: set[str]) -> dict[str, Any]:
    # llama.cpp: layers 0, 2, 4, ... slide 4,096 tokens (its defaults, as Gemma 2's configs); 46 layers is the 27B
    period = int(key("attention.sliding_window_pattern", 2))
    kinds = ["sliding" if i % period < period - 1 else "full" for i in range(int(key("block_count")))]
    return _gguf_fields(key, kinds, int(key("attention.sliding_window", 4096)), 46)


def _gemma3_gguf(key: GGUFKey, names: set[str]) -> dict[str, Any]:
    # llama.cpp: five sliding layers, then a global one; the sliding ones rotate with their own base, 10,000 where
    # the file names none; 62 layers is the 27B
    kinds = ["sliding" if i % 6 < 5 else "full" for i in range(int(key("block_count")))]
    local_theta = float(key("rope.freq_base_swa", 10000.0))
    return _gguf_fields(key, kinds, int(key("attention.sliding_window")), 62) | {"rope_theta_sliding": local_theta}


GEMMA2 = Family("gemma2", ("Gemma2ForCausalLM",), ("gemma2",), _gemma2, _gemma2_gguf, hf_rename=_rename,
                hf_norm_plus_one=True, gguf_names=OUTPUT_NORM_NAMES)
GEMMA3 = Family("gemma3", ("Gemma3ForCausalLM",), ("gemma3",), _gemma3, _gemma3_gguf, hf_rename=_rename,
                hf_norm_plus_one=True, gguf_names=OUTPUT_NORM_NAMES)
