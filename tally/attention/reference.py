"""The reference backend: per prefill sequence, gather its K/V and call SDPA with an explicit mask."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tally.attention.kv_cache import KVCache
from tally.attention.metadata import AttentionMetadata
from tally.attention.paged import PagedBackend, gather_sequence_kv, is_plain_causal
from tally.attention.eager import eager_attention


def causal_window_mask(
    first_query_pos: int, end_query_pos: int, first_key_pos: int, end_key_pos: int, window: int | None,
    device: torch.device,
) -> torch.Tensor:
    """bool [queries, keys]: True where a query may see a key (causal, and within the window)."""
    query_pos = torch.arange(first_query_pos, end_query_pos, device=device)[:, None]
    key_pos = torch.arange(first_key_pos, end_key_pos, device=device)[None, :]
    allowed = key_pos <= query_pos
    if window is not None:
        allowed &= key_pos > query_pos - window
    return allowed


class ReferenceBackend(PagedBackend):
    def _prefill(
        self, q: torch.Tensor, k_cache: KVCache, v_cache: KVCache,
        block_table_row: torch.Tensor, context_len: int, out: torch.Tensor, meta: AttentionMetadata,
    ) -> None:
        cfg = self.config
        first_query_pos = context_len - q.shape[0]
        window = cfg.sliding_window
        # Keys older than the first query's window are never seen (and may already be released).
        first_key_pos = 0 if window is None else max(0, first_query_pos - window + 1)
        k = gather_sequence_kv(k_cache, block_table_row, first_key_pos, context_len, cfg.compute_dtype)
        v = gather_sequence_kv(v_cache, block_table_row, first_key_pos, context_len, cfg.compute_dtype)
        plain_causal = is_plain_causal(q.shape[0], context_len, window)
        mask = None
        if not plain_causal:
            key = ("mask", first_query_pos, context_len, first_key_pos, context_len, window)
            mask = meta.memo(key, lambda: causal_window_mask(
                first_query_pos, context_len, first_key_pos, context_len, window, q.device))
        q4, k4, v4 = q.to(cfg.compute_dtype).transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
        if cfg.eager:
            allowed = mask if mask is not None else causal_window_mask(
                first_query_pos, context_len, first_key_pos, context_len, window, q.device)
            out.copy_(eager_attention(q4, k4, v4, allowed, cfg.scale, cfg.logit_softcap, cfg.sink_logits())[0]
                      .transpose(0, 1))
            return
        # A batch dimension matters: torch's CPU flash kernel takes 4-D inputs only; 3-D ones fall
        # back to the math path, which materialises the [Hq, Lq, Lk] scores (several times slower on long prompts).
        result = F.scaled_dot_product_attention(
            q4, k4, v4, attn_mask=mask, is_causal=plain_causal, scale=cfg.scale,
            enable_gqa=cfg.num_queries_per_kv > 1,
        )
        out.copy_(result[0].transpose(0, 1))
