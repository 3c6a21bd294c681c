"""Which of a model's traits (tally/models/config.py) the native fused paths compute, trait by trait: the per-layer
fused forward (DecoderLayer._forward_native) and the one-call decode step (native_decode_step.py). A model with a
trait outside these runs the PyTorch layers, as it would without the kernels: never a different computation."""
from __future__ import annotations

from dataclasses import MISSING, fields

from tally.models.config import ModelConfig
from tally.native.ops import ACTIVATIONS

# Traits computed whatever their value: the shape, the rotary tables (scalings included: the kernels read the same
# tables), windows per layer, scales, soft caps, attention sinks, projections' biases, multipliers, clamped SwiGLU's
# settings. The attention of the per-layer path is its backend's.
ANY_VALUE = frozenset({
    "architecture", "vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
    "head_dim", "rms_norm_eps", "rope_theta", "rope_scaling", "max_position_embeddings", "tie_word_embeddings",
    "attention_bias", "attention_output_bias", "attention_sinks", "sliding_window", "bos_token_id", "eos_token_ids",
    "torch_dtype", "norm_scale_in_float", "layer_types", "rope_theta_sliding", "nope_layers", "partial_rotary_factor",
    "attn_logit_softcap", "final_logit_softcap", "query_scale", "embedding_multiplier", "residual_multiplier",
    "logits_scaling", "swiglu_limit", "swiglu_alpha",
})
# Traits computed for these values only
VALUES = {"norm_layout": ("pre", "sandwich", "post"), "qk_norm": (None, "head", "projection"),
          "activation": tuple(ACTIVATIONS)}


def layer_unsupported(cfg: ModelConfig) -> list[str]:
    """`field=value` of each trait the native fused paths do not compute (experts: tally/models/native_experts.py
    says which it runs, else the PyTorch loop runs inside them). A field this module does not know (a trait added
    later) counts unless it holds its default."""
    found = []
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if f.name in ANY_VALUE or f.name == "experts" or value in VALUES.get(f.name, ()):
            continue
        if f.name in VALUES or value != (f.default if f.default is not MISSING else f.default_factory()):
            found.append(f"{f.name}={value!r}")
    if int(cfg.head_dim * cfg.partial_rotary_factor) % 2:
        found.append(f"partial_rotary_factor={cfg.partial_rotary_factor!r}")  # rotate-half needs pairs
    return found

