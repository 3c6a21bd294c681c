"""Checkpoint tensors (HF names) → a CausalLM with fused projections, quantized if asked."""
from __future__ import annotations

import torch

from tally.attention.backend import AttentionBackend
from tally.errors import ModelLoadError
from tally.layers.linear import build_linear
from tally.models.llama import CausalLM
from tally.models.config import ModelConfig


def build_model(config: ModelConfig, tensors: dict[str, torch.Tensor], *, dtype: torch.dtype,
                quantization: str | None, attn: AttentionBackend, max_model_len: int) -> CausalLM:
    """Consumes `tensors` (popped as used, so peak memory stays near one copy of the weights)."""

    def make_proj(names: list[str], bias: bool) -> torch.nn.Module:
        try:
            weights = [tensors.pop(f"{n}.weight") for n in names]
            biases = [tensors.pop(f"{n}.bias") for n in names] if bias else None
        except KeyError as exc:
            raise ModelLoadError(f"checkpoint is missing tensor {exc.args[0]!r}") from exc
        weight = weights[0] if len(weights) == 1 else torch.cat(weights)
        b = None if biases is None else (biases[0] if len(biases) == 1 else torch.cat(biases))
        return build_linear(weight, b, quantization=quantization, dtype=dtype)

    cfg = config
    if max_model_len < cfg.max_position_embeddings:
        # The rotary table only needs the positions the engine will ever use.
        from dataclasses import replace

        cfg = replace(cfg, max_position_embeddings=max_model_len)
    try:
        model = CausalLM(cfg, tensors, make_proj, attn, dtype)
    except KeyError as exc:
        raise ModelLoadError(f"checkpoint is missing tensor {exc.args[0]!r}") from exc
    leftover = [n for n in tensors if "rotary_emb" not in n]
    if leftover:
        raise ModelLoadError(f"checkpoint has tensors this architecture does not use: {leftover[:5]}")
    return model.eval()
