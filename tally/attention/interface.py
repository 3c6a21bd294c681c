"""What every attention backend is: the shape and masking rule it serves, and the one call the model makes."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from tally.attention.kv_cache import KVCache
from tally.attention.metadata import AttentionMetadata


@dataclass(frozen=True)
class AttentionConfig:
    """The shape and masking rule of a model's attention layers (of one kind, where layers differ: windows)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    sliding_window: int | None  # a query at position p sees keys at positions > p - sliding_window
    compute_dtype: torch.dtype = torch.float32
    logit_softcap: float | None = None  # scores = cap * tanh(scores / cap) before the softmax (Gemma 2)
    # one learned logit per query head that joins each softmax's denominator, with no value (GPT-OSS); a layer's own
    sinks: tuple[float, ...] | None = None

    @property
    def eager(self) -> bool:
        """Scores PyTorch's fused attention does not compute (soft-capped, or with sinks): off the native kernels,
        which take both, they are materialised (tally/attention/eager.py)."""
        return self.logit_softcap is not None or self.sinks is not None

    def sink_logits(self) -> torch.Tensor | None:
        return None if self.sinks is None else torch.tensor(self.sinks, dtype=torch.float32)

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads


class AttentionBackend(Protocol):
    config: AttentionConfig

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: KVCache,
        v_cache: KVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """q [T, Hq, D], k/v [T, Hkv, D] (new tokens, rotary applied); k_cache/v_cache
        [num_blocks, block_size, Hkv, D] (tensors, or Int8KVCache values + scales) are this layer's
        cache, written in place at meta.slot_mapping before attending. Returns [T, Hq, D] in q's dtype."""
        ...

    def attend(self, q: torch.Tensor, k_cache: KVCache, v_cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
        """`forward` for a step whose K/V the caller has already written at meta.slot_mapping."""
        ...
