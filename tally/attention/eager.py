"""Attention with its scores materialised, as Hugging Face's eager attention computes them, for what no fused kernel
here computes: soft-capped scores (Gemma 2: scores = cap * tanh(scores / cap)) and attention sinks (GPT-OSS: a
learned logit per head joins each softmax's denominator, with no value)."""
from __future__ import annotations

import torch


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None, scale: float,
                    cap: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q [B, Hq, Lq, D], k/v [B, Hkv, Lk, D]; `allowed`: bool, broadcastable to [B, Hq, Lq, Lk], True where a query
    sees a key (None: every key); `sinks`: [Hq] logits."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if cap is not None:
        scores = torch.tanh(scores / cap) * cap
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    if sinks is None:
        return torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), v)
    sink = sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    combined = torch.cat([scores, sink], dim=-1)
    combined = combined - combined.amax(dim=-1, keepdim=True)
    probs = torch.softmax(combined, dim=-1, dtype=torch.float32)[..., :-1]
    return torch.matmul(probs.to(q.dtype), v)
