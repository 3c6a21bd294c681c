"""Attention over a paged KV cache, behind one interface.

The model calls `backend.forward(q, k, v, k_cache, v_cache, meta)` once per layer per step;
`make_backend(name, ...)` in backend.py is the only place that chooses the implementation;
interface.py holds what every backend is (AttentionConfig, the AttentionBackend protocol).

Backends (CPU, plain PyTorch, math in float32):
- "reference" (reference.py): gathers each prefill sequence's K/V and calls SDPA with an explicit
  causal + sliding-window mask. Simple enough to trust; the oracle for everything else.
- "tiled" (tiled.py): FlashAttention's online softmax for prefills, reading K/V tile by tile
  straight from the paged cache, so memory stays O(tile) instead of O(Lq * Lk).
- "auto" (auto.py): per prefill sequence, reference when the mask is plain causal (torch's fused
  kernel), tiled when a cached prefix or a window needs an explicit mask.
All share paged.py (the cache write and the per-sequence driver) and decode.py (all decode rows
in one batched SDPA, gathering into workspace.py's buffers, reused between layers and steps).

Cache layout: k_cache / v_cache are [num_blocks, block_size, num_kv_heads, head_dim] per layer,
the "NHD" paged layout vLLM and FlashInfer use, so GPU kernels can read it unchanged. With
--kv-cache-dtype int8 each is a tally.attention.kv_cache.Int8KVCache instead: int8 values in that layout plus
float32 scales [num_blocks, num_kv_heads]; paged.py writes it (scales grow as a block fills) and every
read path (decode gather, prefill gather, tiles) dequantizes to the compute dtype.

Per-step work: everything derived from the metadata alone (the decode slot grid and mask, prefill
and tile masks, the int8 write plan) is built by the first layer of a step and memoised on the
AttentionMetadata (`meta.memo`), so the other layers only move K/V and do the math.

Plugging in a GPU backend (Triton / FlashInfer):
1. Add a module here with a class that has the `AttentionBackend.forward` signature. It may
   subclass `PagedBackend` (paged.py) and override only `_prefill`, or replace `forward` whole
   (a real kernel handles decodes and prefills of the batch in one launch).
2. Metadata arrives as python lists for the CPU path; a GPU backend converts query_start_loc /
   context_lens to device tensors once per step with `meta.memo(...)` (as FlashInfer's wrappers
   plan once) rather than once per layer.
3. Add it to BACKENDS in backend.py; if its module imports triton or flashinfer at the top,
   import it lazily in `make_backend` instead, so CPU-only installs never import them.
4. Run tests/test_attention*.py with the new name: the dense oracle there is backend-agnostic.
"""
from __future__ import annotations

from tally.attention.backend import BACKEND_NAMES, make_backend
from tally.attention.interface import AttentionBackend, AttentionConfig
from tally.attention.metadata import AttentionMetadata

__all__ = ["BACKEND_NAMES", "AttentionBackend", "AttentionConfig", "AttentionMetadata", "make_backend"]
