"""What several families read the same way from a GGUF's metadata (the shape every family shares
is read by tally/models/gguf_header.py): float32 values as the literal the converter saw, mixtures of experts, and
llama.cpp's names of a block's output norms."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tally.models.config import Experts

# A GGUF metadata reader: key without the `{arch}.` prefix (and a default) -> value
GGUFKey = Callable[..., Any]

# llama.cpp's names of the norms of a block's output, before the residual add (Gemma, OLMo 2)
OUTPUT_NORM_NAMES = {"post_attention_norm.weight": "attn_output_norm.weight",
                     "post_ffw_norm.weight": "mlp_output_norm.weight"}


def float32_literal(value: object) -> float:
    """GGUF stores float32: 1e-5 comes back as 9.99999974e-06; recover the literal the converter saw."""
    return float(str(np.float32(value)))


def yarn_scaling(key: GGUFKey) -> dict[str, Any] | None:
    """The rotary scaling where the file's is YaRN (None otherwise), by transformers' names."""
    if key("rope.scaling.type", None) != "yarn":
        return None
    scaling = {"rope_type": "yarn", "factor": float32_literal(key("rope.scaling.factor")),
               "original_max_position_embeddings": int(key("rope.scaling.original_context_length"))}
    for ours, theirs in (("beta_fast", "yarn_beta_fast"), ("beta_slow", "yarn_beta_slow"),
                         ("attention_factor", "yarn_attn_factor")):
        value = key(f"rope.scaling.{theirs}", None)
        if value is not None:
            scaling[ours] = float32_literal(value)
    return scaling


def experts(key: GGUFKey, normalize_top_k: bool) -> dict[str, Any]:
    """ModelConfig's `experts` where the file has any (`expert_count`), in every layer as llama.cpp reads them.
    `normalize_top_k`: what llama.cpp fixes for the architecture where the file does not say
    (`expert_weights_norm`)."""
    count = int(key("expert_count", 0) or 0)
    if not count:
        return {}
    size = key("expert_feed_forward_length", None) or key("feed_forward_length")
    return {"experts": Experts(num_experts=count, top_k=int(key("expert_used_count")), intermediate_size=int(size),
                               normalize_top_k=bool(key("expert_weights_norm", normalize_top_k)))}
