"""The "auto" backend: per prefill sequence, the kernel that suits its mask.

Under fp32 or bf16 compute, every prefill (whole prompt or a chunk after cached tokens, windowed or not) goes to the
native causal kernel (tally/native/prefill_attention.h), which reads the cache in place and skips masked tiles, faster
than the PyTorch paths (docs/benchmarks.md#attention), soft-capped or sink-weighted scores (Gemma 2, GPT-OSS)
included; the int8 cache goes row by row through the native decode kernel instead. Otherwise a plain causal prefill
goes to the reference path (torch's fused CPU flash kernel, no mask), and a chunk after cached tokens or a sliding
window, whose mask SDPA would materialise as an [Lq, Lk] float tensor, to the tiled kernel, unless the mask is small
(a short chunk).
"""
from __future__ import annotations

import torch

from tally.attention.decode import DECODE_GATHER_KEYS, native_attention_supported, native_decode_attention
from tally.attention.interface import AttentionConfig
from tally.attention.kv_cache import Int8KVCache, KVCache
from tally.attention.metadata import AttentionMetadata
from tally.attention.paged import PagedBackend, is_plain_causal
from tally.attention.reference import ReferenceBackend
from tally.attention.tiled import TiledBackend
from tally.native import ops as native

# A short chunk after a long cached prefix (a latency-bounded prefill chunk) has a small mask: one SDPA call per
# layer beats the tiled kernel's Python loop over key tiles there (`python benchmarks/long_prompt_itl.py`).
SMALL_MASK_ELEMENTS = 1 << 20


class AutoBackend(PagedBackend):
    def __init__(self, config: AttentionConfig, *, decode_gather_keys: int = DECODE_GATHER_KEYS) -> None:
        super().__init__(config, decode_gather_keys=decode_gather_keys)
        self._plain = ReferenceBackend(config)
        self._masked = TiledBackend(config)

    def _prefill(
        self, q: torch.Tensor, k_cache: KVCache, v_cache: KVCache,
        block_table_row: torch.Tensor, context_len: int, out: torch.Tensor, meta: AttentionMetadata,
    ) -> None:
        cfg = self.config
        if native_attention_supported(k_cache, cfg):
            # bf16 compute: the same fp32 kernels over the bf16 cache, rounded once, so bf16 prompts also keep their
            # bits split across steps
            target = out if out.dtype == torch.float32 else torch.empty(out.shape, dtype=torch.float32)
            self._native_prefill(q.float(), k_cache, v_cache, block_table_row, context_len, target)
            if target is not out:
                out.copy_(target)
            return
        plain = is_plain_causal(q.shape[0], context_len, cfg.sliding_window)
        small_mask = q.shape[0] * context_len <= SMALL_MASK_ELEMENTS
        # the reference path materialises a soft-capped or sink-weighted prompt's scores; the tiled kernel adds sinks
        plain_kernel = plain and cfg.sinks is None
        backend = self._plain if plain_kernel or small_mask or cfg.logit_softcap is not None else self._masked
        backend._prefill(q, k_cache, v_cache, block_table_row, context_len, out, meta)

    def _native_prefill(self, q: torch.Tensor, k_cache: KVCache, v_cache: KVCache, block_table_row: torch.Tensor,
                        context_len: int, out: torch.Tensor) -> None:
        cfg = self.config
        first_pos = context_len - q.shape[0]
        # the int8 cache, which the prefill kernel does not read: each row as a decode, so a prompt split across steps
        # keeps its bits
        if isinstance(k_cache, Int8KVCache):
            lens = torch.arange(first_pos + 1, context_len + 1, dtype=torch.int64)
            native_decode_attention(q, k_cache, v_cache, block_table_row[None].expand(q.shape[0], -1), lens, cfg, out)
        else:
            native.prefill_attention(q, k_cache, v_cache, block_table_row, first_pos, cfg.sliding_window, cfg.scale,
                                     cfg.logit_softcap, cfg.sink_logits(), out=out)
