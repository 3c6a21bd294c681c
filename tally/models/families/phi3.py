"""Phi-3, 3.5 and 4(-mini): fused q/k/v and gate/up projections, LongRoPE, partial rotary (Phi-4-mini)."""
from __future__ import annotations

from typing import Any

from tally.models.config import ModelConfig
from tally.models.families.family import Family
from tally.models.families.hf_fields import activation, shape_fields, windows


def _phi3(cfg: dict[str, Any]) -> ModelConfig:
    fields = shape_fields(cfg, "phi3")
    fields |= windows(cfg, fields["num_layers"], cfg.get("sliding_window"))
    rotary = cfg.get("partial_rotary_factor") or (cfg.get("rope_parameters") or {}).get("partial_rotary_factor")
    return ModelConfig(**fields, activation=activation(cfg, "phi3"), partial_rotary_factor=float(rotary or 1.0))


_QKV = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight")
_GATE_UP = ("mlp.gate_proj.weight", "mlp.up_proj.weight")

# LongRoPE and partial rotary come from a GGUF's rotary tensors and rope.dimension_count (tally/models/gguf_header.py)
PHI3 = Family("phi3", ("Phi3ForCausalLM",), ("phi3",), _phi3,
              hf_fused={"self_attn.qkv_proj.weight": _QKV, "mlp.gate_up_proj.weight": _GATE_UP},
              gguf_fused={"attn_qkv.weight": _QKV, "ffn_up.weight": _GATE_UP})
