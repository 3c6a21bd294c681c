"""Attention over a paged KV cache, behind one interface (interface.py) chosen in one place (backend.py).

Backends: "reference" (SDPA with an explicit mask, the oracle), "tiled" (FlashAttention's online softmax over the
paged cache, tile by tile) and "auto" (per prefill sequence, the kernel that suits its mask). All share paged.py (the
cache write, the per-sequence driver) and decode.py (every decode row in one batched call). The cache is
[num_blocks, block_size, num_kv_heads, head_dim] per layer, vLLM's "NHD" layout, or its int8 form (kv_cache.py).
"""
from __future__ import annotations

from tally.attention.backend import BACKEND_NAMES, make_backend
from tally.attention.interface import AttentionBackend, AttentionConfig
from tally.attention.metadata import AttentionMetadata

__all__ = ["BACKEND_NAMES", "AttentionBackend", "AttentionConfig", "AttentionMetadata", "make_backend"]
