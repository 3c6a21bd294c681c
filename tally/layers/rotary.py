"""Rotary position embedding (rotate-half layout, as Hugging Face's Llama/Qwen checkpoints expect).

cos/sin are precomputed once for every position up to max_position and indexed per step, so a
step costs one gather, not a trigonometric evaluation."""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from tally.errors import ModelLoadError


SCALINGS = ("linear", "llama3", "longrope", "yarn", "divisors")


def inverse_frequencies(rotary_dim: int, theta: float, scaling: dict[str, Any] | None,
                        max_position: int) -> tuple[torch.Tensor, float]:
    """(inverse frequencies, the factor cos and sin are scaled by) for the rotated dimensions of a head, whose
    positions stay below `max_position`."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    inv_freq = 1.0 / (theta ** exponents)
    kind = None if scaling is None else scaling["rope_type"]
    if kind is None:
        return inv_freq, 1.0
    if kind == "linear":
        return inv_freq / float(scaling["factor"]), 1.0
    if kind == "llama3":
        return _llama3_frequencies(inv_freq, scaling), 1.0
    if kind == "longrope":
        return _longrope_frequencies(exponents, theta, scaling, max_position)
    if kind == "yarn":
        return _yarn_frequencies(exponents, theta, rotary_dim, scaling)
    if kind == "divisors":  # llama.cpp's rope_freqs: Llama 3.1's scaling, computed by its converter
        return inv_freq / torch.tensor(scaling["divisors"], dtype=torch.float32), 1.0
    raise ModelLoadError(f"rope scaling {kind!r} is not supported; supported: {', '.join(SCALINGS)}")


def _longrope_frequencies(exponents: torch.Tensor, theta: float, s: dict[str, Any],
                          max_position: int) -> tuple[torch.Tensor, float]:
    # Phi-3: per-dimension divisors, the long ones when the context may pass the original one. Chosen once for the
    # engine's whole context, as llama.cpp does, not per batch (Hugging Face switches on a step's longest position).
    original = int(s["original_max_position_embeddings"])
    factors = s["long_factor"] if max_position > original else s["short_factor"]
    inv_freq = 1.0 / (torch.tensor(factors, dtype=torch.float32) * theta ** exponents)
    factor = float(s.get("factor") or 1.0)
    scale = s.get("attention_factor")
    if scale is None:
        scale = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return inv_freq, float(scale)


def _yarn_frequencies(exponents: torch.Tensor, theta: float, dim: int,
                      s: dict[str, Any]) -> tuple[torch.Tensor, float]:
    # YaRN, as transformers computes it: frequencies that turn fewer than beta_slow times over the original context
    # are divided by `factor`, those that turn more than beta_fast times are kept, a linear ramp blends in between;
    # cos and sin are scaled by the attention factor (0.1 ln(factor) + 1 unless the config gives it or mscales).
    factor, original = float(s["factor"]), int(s["original_max_position_embeddings"])

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = s.get("attention_factor")
    if attention is None:
        m, m_all = s.get("mscale"), s.get("mscale_all_dim")
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(s.get("beta_fast") or 32), correction_dim(s.get("beta_slow") or 1)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / ((high - low) or 0.001), 0, 1)
    pos_freqs = theta ** exponents
    extrapolation = 1 - ramp  # the share of each frequency kept as it is
    inv_freq = 1.0 / (factor * pos_freqs) * (1 - extrapolation) + 1.0 / pos_freqs * extrapolation
    return inv_freq, float(attention)


def _llama3_frequencies(inv_freq: torch.Tensor, s: dict[str, Any]) -> torch.Tensor:
    # Llama 3.1: keep high frequencies, divide low ones by `factor`, blend in between.
    factor, low, high = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old_len = float(s["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(medium, blended, scaled)


class RotaryEmbedding(nn.Module):
    """`rotary_dim` < head_dim: only a head's first rotary_dim dimensions rotate (partial rotary, Phi-4-mini)."""

    def __init__(self, head_dim: int, max_position: int, theta: float,
                 scaling: dict[str, Any] | None, dtype: torch.dtype, rotary_dim: int | None = None) -> None:
        super().__init__()
        self.rotary_dim = rotary_dim or head_dim
        self.partial = self.rotary_dim < head_dim
        inv_freq, scale = inverse_frequencies(self.rotary_dim, theta, scaling, max_position)
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if scale != 1.0:
            cos, sin = cos * scale, sin * scale
        self.register_buffer("cos", cos.to(dtype), persistent=False)
        self.register_buffer("sin", sin.to(dtype), persistent=False)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, 1, rotary_dim] for a step's positions: gathered once per step, shared by every layer."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)

    def rotate(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """x [T, H, head_dim] with its first rotary_dim dimensions rotated."""
        if not self.partial:
            return apply_rotary(x, *rope)
        d = self.rotary_dim
        return torch.cat([apply_rotary(x[..., :d], *rope), x[..., d:]], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] → rotated. Callers pass q and k as one [T, Hq + Hkv, D] view when they can: half the ops."""
    return x * cos + _rotate_half(x) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
