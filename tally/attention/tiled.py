"""FlashAttention's online softmax on CPU for long prefills over the paged cache.

For each tile of query rows, K/V are read from the cache one key tile (a few whole blocks) at a
time; a running max m, running sum l and output accumulator per query row are rescaled as each
tile arrives (an attention sink, GPT-OSS, is a first key with no value). Key tiles above the causal
diagonal or below the sliding window are never read, and masks are built only for tiles that
straddle those edges. Peak extra memory is one score tile [Hq, query_tile, key_tile] instead of
[Hq, Lq, Lk].
"""
from __future__ import annotations

import torch

from tally.attention.decode import DECODE_GATHER_KEYS
from tally.attention.interface import AttentionConfig
from tally.attention.kv_cache import KVCache
from tally.attention.metadata import AttentionMetadata
from tally.attention.paged import PagedBackend, gather_sequence_kv
from tally.attention.reference import causal_window_mask


class TiledBackend(PagedBackend):
    def __init__(
        self, config: AttentionConfig, *, query_tile: int = 128, key_tile: int = 256,
        decode_gather_keys: int = DECODE_GATHER_KEYS,
    ) -> None:
        super().__init__(config, decode_gather_keys=decode_gather_keys)
        self.query_tile = query_tile
        self.key_tile = key_tile

    def _prefill(
        self, q: torch.Tensor, k_cache: KVCache, v_cache: KVCache,
        block_table_row: torch.Tensor, context_len: int, out: torch.Tensor, meta: AttentionMetadata,
    ) -> None:
        num_queries = q.shape[0]
        first_query_pos = context_len - num_queries
        for start in range(0, num_queries, self.query_tile):
            end = min(start + self.query_tile, num_queries)
            out[start:end] = self._query_tile(
                q[start:end], k_cache, v_cache, block_table_row, first_query_pos + start, meta,
            )

    def _query_tile(
        self, q: torch.Tensor, k_cache: KVCache, v_cache: KVCache,
        block_table_row: torch.Tensor, first_pos: int, meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Rows at positions first_pos .. first_pos + n - 1; q [n, Hq, D] -> [n, Hq, D]."""
        cfg = self.config
        n, num_heads, head_dim = q.shape
        kv_heads, group = cfg.num_kv_heads, cfg.num_queries_per_kv
        last_pos = first_pos + n - 1
        window = cfg.sliding_window
        block_size = k_cache.shape[1]
        # Heads sharing a KV head are stacked with the rows, so one bmm per KV head covers them:
        # [n, Hkv*G, D] -> [Hkv, G*n, D].
        qt = (q.to(cfg.compute_dtype) * cfg.scale).view(n, kv_heads, group, head_dim)
        qt = qt.permute(1, 2, 0, 3).reshape(kv_heads, group * n, head_dim)
        row_max = torch.full((kv_heads, group * n, 1), float("-inf"), dtype=qt.dtype, device=qt.device)
        row_sum = torch.zeros_like(row_max)
        if cfg.sinks is not None:  # a sink is one more key, seen first: its logit the running max, exp(0) the sum
            row_max = cfg.sink_logits().to(qt.dtype).view(kv_heads, group, 1, 1).expand(-1, -1, n, -1)
            row_max = row_max.reshape(kv_heads, group * n, 1)
            row_sum = torch.ones_like(row_max)
        acc = torch.zeros_like(qt)

        lowest_key = 0 if window is None else max(0, first_pos - window + 1)
        key_step = max(1, self.key_tile // block_size) * block_size
        for key_start in range(lowest_key // block_size * block_size, last_pos + 1, key_step):
            key_end = min(key_start + key_step, last_pos + 1)
            k = gather_sequence_kv(k_cache, block_table_row, key_start, key_end, cfg.compute_dtype)
            v = gather_sequence_kv(v_cache, block_table_row, key_start, key_end, cfg.compute_dtype)
            scores = torch.bmm(qt, k.permute(1, 2, 0))  # [Hkv, G*n, Lk]
            if cfg.logit_softcap is not None:
                scores = torch.tanh(scores / cfg.logit_softcap) * cfg.logit_softcap
            crosses_diagonal = key_end - 1 > first_pos
            crosses_window = window is not None and key_start <= last_pos - window
            if crosses_diagonal or crosses_window:
                key = ("hidden", first_pos, last_pos + 1, key_start, key_end, window)
                hidden = meta.memo(key, lambda: ~causal_window_mask(
                    first_pos, last_pos + 1, key_start, key_end, window, qt.device))
                scores.view(kv_heads, group, n, -1).masked_fill_(hidden, float("-inf"))
            new_max = torch.maximum(row_max, scores.amax(dim=-1, keepdim=True))
            # A row with no visible key yet keeps max -inf; shift it by 0 so exp() gives 0, not NaN.
            shift = torch.where(new_max == float("-inf"), 0.0, new_max)
            probs = scores.sub_(shift).exp_()
            rescale = torch.exp(row_max - shift)
            row_sum.mul_(rescale).add_(probs.sum(dim=-1, keepdim=True))
            acc.mul_(rescale).baddbmm_(probs, v.transpose(0, 1))
            row_max = new_max
        out = (acc / row_sum).view(kv_heads, group, n, head_dim)
        return out.permute(2, 0, 1, 3).reshape(n, num_heads, head_dim)
