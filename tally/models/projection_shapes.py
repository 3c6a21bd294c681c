"""A model's projections as the start-up measurement sees them: shapes, how many layers hold each, and how each
is stored under a quantization choice — the same decisions tally/models/builder.py makes when it loads them."""
from __future__ import annotations

from typing import TYPE_CHECKING

from tally.layers.path_timing import ProjectionShape
from tally.models.config import ModelConfig
from tally.quant.gguf_blocks import adopted_storage

if TYPE_CHECKING:
    from tally.models.loader import Checkpoint

# fused projection -> the checkpoint tensor of its first part, which decides its storage in a GGUF file
_FIRST_PART = {"qkv": "self_attn.q_proj", "o": "self_attn.o_proj", "gate_up": "mlp.gate_proj",
               "down": "mlp.down_proj"}


def projection_shapes(cfg: ModelConfig, quantization: str | None,
                      checkpoint: Checkpoint | None = None) -> list[ProjectionShape]:
    h, layers = cfg.hidden_size, cfg.num_layers
    dims = {"qkv": (cfg.q_size + 2 * cfg.kv_size, h), "o": (h, cfg.q_size),
            "gate_up": (2 * cfg.intermediate_size, h), "down": (h, cfg.intermediate_size)}
    shapes = [ProjectionShape(name, n, k, layers, *_storage(quantization, checkpoint, f"model.layers.0.{part}", k))
              for (name, (n, k)), part in zip(dims.items(), _FIRST_PART.values())]
    tied = cfg.tie_word_embeddings or (checkpoint is not None and checkpoint.format == "gguf"
                                       and checkpoint.gguf_tensor("lm_head.weight") is None)
    storage, group = _storage(quantization, checkpoint, "model.embed_tokens" if tied else "lm_head", h, head=True)
    shapes.append(ProjectionShape("lm_head", cfg.vocab_size, h, 1, storage, group, decode_only=True))
    return shapes


def _storage(quantization: str | None, checkpoint: Checkpoint | None, name: str, in_features: int,
             head: bool = False) -> tuple[str, int]:
    """(storage, group size) as the builder chooses them (tally/layers/linear.py, builder.make_head)."""
    if quantization == "gguf":
        raw = checkpoint.gguf_tensor(f"{name}.weight") if checkpoint is not None else None
        adopted = adopted_storage(getattr(raw.ggml_type, "name", "")) if raw is not None else None
        return adopted or ("dense", 0)
    if quantization in ("int4", "int8") and head:  # the builder's int8 head for on-the-fly int4 / int8
        return "int8", 0
    if quantization == "int4":
        return "int4", next((g for g in (128, 64, 32) if in_features % g == 0), 128)
    if quantization in ("int8", "w8a8"):
        return quantization, 0
    return "dense", 0
