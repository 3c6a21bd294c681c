"""The attention backend interface and the single place that chooses an implementation."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from tally.attention.metadata import AttentionMetadata
from tally.errors import ConfigError
from tally.kv.quant import KVCache

BACKEND_NAMES = ("auto", "reference", "tiled")


@dataclass(frozen=True)
class AttentionConfig:
    """The shape and masking rule of one model's attention layers (the same for every layer)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    sliding_window: int | None  # a query at position p sees keys at positions > p - sliding_window
    compute_dtype: torch.dtype = torch.float32

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


def make_backend(
    name: str,
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    scale: float,
    sliding_window: int | None,
    compute_dtype: torch.dtype = torch.float32,
) -> AttentionBackend:
    """Build the attention backend called `name` (one of BACKEND_NAMES)."""
    if num_kv_heads <= 0 or num_heads % num_kv_heads != 0:
        raise ConfigError(
            f"num_heads ({num_heads}) must be a positive multiple of num_kv_heads ({num_kv_heads}); "
            "check num_attention_heads / num_key_value_heads in the model config"
        )
    if sliding_window is not None and sliding_window <= 0:
        raise ConfigError(
            f"sliding_window must be a positive number of tokens or None, got {sliding_window}"
        )
    config = AttentionConfig(num_heads, num_kv_heads, head_dim, scale, sliding_window, compute_dtype)
    # Imported here so that a GPU backend's heavy imports (triton, flashinfer) only happen when chosen.
    if name == "auto":
        from tally.attention.auto import AutoBackend

        return AutoBackend(config)
    if name == "reference":
        from tally.attention.reference import ReferenceBackend

        return ReferenceBackend(config)
    if name == "tiled":
        from tally.attention.tiled import TiledBackend

        return TiledBackend(config)
    raise ConfigError(
        f"unknown attention backend {name!r}; choose one of: {', '.join(BACKEND_NAMES)}",
        param="attention_backend",
    )
