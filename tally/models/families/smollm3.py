"""SmolLM3: Llama's layer, with every fourth layer's rotary left out (NoPE)."""
from __future__ import annotations

from typing import Any

from tally.models.config import ModelConfig
from tally.models.families.family import Family
from tally.models.families.gguf_fields import GGUFKey
from tally.models.families.hf_fields import activation, shape_fields, windows


def _smollm3(cfg: dict[str, Any]) -> ModelConfig:
    fields = shape_fields(cfg, "smollm3")
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window") else None
    fields |= windows(cfg, fields["num_layers"], window)
    uses_rope = cfg.get("no_rope_layers") or [1] * fields["num_layers"]  # 1: the layer rotates, 0: NoPE
    return ModelConfig(**fields, activation=activation(cfg, "smollm3"),
                       nope_layers=tuple(i for i, rotates in enumerate(uses_rope) if not rotates))


def _smollm3_gguf(key: GGUFKey, names: set[str]) -> dict[str, Any]:
    # llama.cpp leaves rotary out of every fourth layer (3, 7, ...), SmolLM3's no_rope_layer_interval
    return {"nope_layers": tuple(i for i in range(int(key("block_count"))) if (i + 1) % 4 == 0)}


SMOLLM3 = Family("smollm3", ("SmolLM3ForCausalLM",), ("smollm3",), _smollm3, _smollm3_gguf, gguf_rope_permuted=True)
