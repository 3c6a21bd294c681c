"""What every CPU backend shares: writing new K/V into the paged cache, reading a sequence's K/V
back, and the driver that sends a batch's decode rows to decode.py and its prefills to `_prefill`."""
from __future__ import annotations

import torch

from tally.attention.decode import DECODE_GATHER_KEYS, decode_attention
from tally.attention.interface import AttentionConfig
from tally.attention.kv_cache import (
    Int8KVCache,
    KVCache,
    dequantize_blocks,
    write_int8,
)
from tally.attention.metadata import AttentionMetadata
from tally.attention.workspace import Workspace
from tally.errors import TallyError


def write_kv_to_cache(
    k: torch.Tensor, v: torch.Tensor, k_cache: KVCache, v_cache: KVCache, meta: AttentionMetadata,
) -> None:
    """Store new K/V [T, Hkv, D] at meta.slot_mapping; casts to the cache dtype (e.g. bf16) or
    quantizes into an int8 cache."""
    if isinstance(k_cache, Int8KVCache):
        write_int8(k_cache, k, meta.slot_mapping)
        write_int8(v_cache, v, meta.slot_mapping)
        return
    # .view (not .reshape) so a non-contiguous cache raises instead of silently writing to a copy.
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, meta.slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, meta.slot_mapping, v.to(v_cache.dtype))


def gather_sequence_kv(
    cache: KVCache, block_table_row: torch.Tensor, start_pos: int, end_pos: int, dtype: torch.dtype,
) -> torch.Tensor:
    """K or V of one sequence at positions [start_pos, end_pos) as [end_pos - start_pos, Hkv, D] in
    dtype (an int8 cache is dequantized)."""
    block_size = cache.shape[1]
    first_block = start_pos // block_size
    end_block = -(-end_pos // block_size)
    block_ids = block_table_row[first_block:end_block]
    offset = start_pos - first_block * block_size
    if isinstance(cache, Int8KVCache):
        blocks = dequantize_blocks(cache, block_ids, dtype).flatten(0, 1)
        return blocks[offset:offset + end_pos - start_pos]
    blocks = cache.index_select(0, block_ids).flatten(0, 1)
    return blocks[offset:offset + end_pos - start_pos].to(dtype)


def is_plain_causal(num_queries: int, context_len: int, sliding_window: int | None) -> bool:
    """True when a sequence's prefill needs only the square causal mask: no earlier tokens in the
    cache and no window short enough to hide any key."""
    return num_queries == context_len and (sliding_window is None or sliding_window >= context_len)


class PagedBackend:
    """Writes the cache, runs the decode rows batched, then hands each prefill / chunk sequence
    to `_prefill`, the one method a backend must provide."""

    def __init__(self, config: AttentionConfig, *, decode_gather_keys: int = DECODE_GATHER_KEYS) -> None:
        self.config = config
        self.workspace = Workspace()
        self.decode_gather_keys = decode_gather_keys

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        k_cache: KVCache, v_cache: KVCache, meta: AttentionMetadata,
    ) -> torch.Tensor:
        write_kv_to_cache(k, v, k_cache, v_cache, meta)
        return self.attend(q, k_cache, v_cache, meta)

    def attend(self, q: torch.Tensor, k_cache: KVCache, v_cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
        """`forward` after the cache write, for callers that wrote this step's K/V themselves
        (the native rotary-and-store kernel does both in one pass)."""
        n_dec = meta.num_decode_tokens
        starts = meta.query_start_loc
        if starts[n_dec] != n_dec:
            raise TallyError(
                f"attention metadata says the first {n_dec} sequences are decodes (1 token each) but "
                f"they hold {starts[n_dec]} tokens; the runner must order decode rows first"
            )
        if 0 < n_dec == q.shape[0]:  # decode-only step: no output buffer to fill and copy
            return decode_attention(
                q, k_cache, v_cache, meta, self.config, self.workspace, self.decode_gather_keys,
            ).to(q.dtype)
        out = torch.empty_like(q)
        if n_dec:
            out[:n_dec] = decode_attention(
                q[:n_dec], k_cache, v_cache, meta, self.config, self.workspace, self.decode_gather_keys,
            )
        for b in range(n_dec, meta.num_seqs):
            start, end = starts[b], starts[b + 1]
            if start == end:
                continue
            self._prefill(
                q[start:end], k_cache, v_cache, meta.block_tables[b], meta.context_lens[b], out[start:end],
                meta,
            )
        return out

    def _prefill(
        self, q: torch.Tensor, k_cache: KVCache, v_cache: KVCache,
        block_table_row: torch.Tensor, context_len: int, out: torch.Tensor, meta: AttentionMetadata,
    ) -> None:
        """Attention for the Lq = q.shape[0] newest tokens of one sequence whose cache holds
        context_len tokens (theirs included): q [Lq, Hq, D], written into out [Lq, Hq, D]. Masks
        built from positions alone can be memoised on meta (meta.memo), shared by every layer."""
        raise NotImplementedError
