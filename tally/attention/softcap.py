"""Attention with soft-capped scores (Gemma 2: scores = cap * tanh(scores / cap) before the softmax), which no
fused kernel here computes: the scores are materialised, as in Hugging Face's eager attention."""
from __future__ import annotations

import torch


def softcapped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None,
                         scale: float, cap: float) -> torch.Tensor:
    """q [B, Hq, Lq, D], k/v [B, Hkv, Lk, D]; `allowed`: bool, broadcastable to [B, Hq, Lq, Lk], True where a query
    sees a key (None: every key)."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / cap) * cap
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), v)
