"""What every CPU backend shares: writing new K/V into the paged cache, reading a sequence's K/V
back, the batched decode path, and the driver that splits a batch into decodes and prefills."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tally.attention.backend import AttentionConfig
from tally.attention.metadata import AttentionMetadata
from tally.attention.workspace import Workspace
from tally.errors import TallyError


def write_kv_to_cache(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store new K/V [T, Hkv, D] at their slots; casts to the cache dtype (e.g. bf16)."""
    # .view (not .reshape) so a non-contiguous cache raises instead of silently writing to a copy.
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def gather_sequence_kv(
    cache: torch.Tensor, block_table_row: torch.Tensor, start_pos: int, end_pos: int,
) -> torch.Tensor:
    """K or V of one sequence at positions [start_pos, end_pos) as [end_pos - start_pos, Hkv, D]."""
    block_size = cache.shape[1]
    first_block = start_pos // block_size
    end_block = -(-end_pos // block_size)
    blocks = cache.index_select(0, block_table_row[first_block:end_block]).flatten(0, 1)
    offset = start_pos - first_block * block_size
    return blocks[offset:offset + end_pos - start_pos]


def _gather_slots(
    cache: torch.Tensor, slots: torch.Tensor, workspace: Workspace, name: str, dtype: torch.dtype,
) -> torch.Tensor:
    """cache rows at slots [n, L] -> [n, L, Hkv, D] in dtype, in a reused workspace buffer."""
    flat = cache.view(-1, *cache.shape[2:])
    shape = (*slots.shape, *cache.shape[2:])
    # index_select, not cache[slots]: advanced indexing is several times slower on CPU.
    out = workspace.get(name, shape, cache.dtype, cache.device)
    torch.index_select(flat, 0, slots.view(-1), out=out.view(-1, *cache.shape[2:]))
    if dtype == cache.dtype:
        return out
    return workspace.get(name + "_compute", shape, dtype, cache.device).copy_(out)


def decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: list[int], config: AttentionConfig, workspace: Workspace,
) -> torch.Tensor:
    """All single-token decode rows in one batched SDPA. q [n, Hq, D] -> [n, Hq, D] (compute dtype).

    Each row's keys are laid out right-aligned in a [n, L] grid (the last column is the query's
    own position), with L = the longest context, or the window if that is shorter. Grid cells
    before position 0 are masked and point at the row's own (always written) slot, so slots never
    written - which may hold anything, even NaN - are never read.
    """
    n = q.shape[0]
    block_size = k_cache.shape[1]
    num_keys = max(context_lens)
    if config.sliding_window is not None:
        num_keys = min(num_keys, config.sliding_window)
    ctx = torch.tensor(context_lens, dtype=torch.int64, device=k_cache.device)
    positions = ctx[:, None] - num_keys + torch.arange(num_keys, device=k_cache.device)
    valid = positions >= 0
    positions = torch.where(valid, positions, ctx[:, None] - 1)
    slots = block_tables[:n].gather(1, positions // block_size) * block_size + positions % block_size
    k = _gather_slots(k_cache, slots, workspace, "k", config.compute_dtype)  # [n, L, Hkv, D]
    v = _gather_slots(v_cache, slots, workspace, "v", config.compute_dtype)
    mask = None if min(context_lens) >= num_keys else valid[:, None, None, :]
    out = F.scaled_dot_product_attention(
        q.to(config.compute_dtype).unsqueeze(2), k.transpose(1, 2), v.transpose(1, 2),
        attn_mask=mask, scale=config.scale, enable_gqa=config.num_queries_per_kv > 1,
    )
    return out.squeeze(2)


class PagedBackend:
    """Writes the cache, runs the decode rows batched, then hands each prefill / chunk sequence
    to `_prefill`, the one method a backend must provide."""

    def __init__(self, config: AttentionConfig) -> None:
        self.config = config
        self.workspace = Workspace()

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
    ) -> torch.Tensor:
        write_kv_to_cache(k, v, k_cache, v_cache, meta.slot_mapping)
        out = torch.empty_like(q)
        n_dec = meta.num_decode_tokens
        starts = meta.query_start_loc
        if starts[n_dec] != n_dec:
            raise TallyError(
                f"attention metadata says the first {n_dec} sequences are decodes (1 token each) but "
                f"they hold {starts[n_dec]} tokens; the runner must order decode rows first"
            )
        if n_dec:
            out[:n_dec] = decode_attention(
                q[:n_dec], k_cache, v_cache, meta.block_tables, meta.context_lens[:n_dec], self.config,
                self.workspace,
            )
        for b in range(n_dec, meta.num_seqs):
            start, end = starts[b], starts[b + 1]
            if start == end:
                continue
            self._prefill(
                q[start:end], k_cache, v_cache, meta.block_tables[b], meta.context_lens[b], out[start:end],
            )
        return out

    def _prefill(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
        block_table_row: torch.Tensor, context_len: int, out: torch.Tensor,
    ) -> None:
        """Attention for the Lq = q.shape[0] newest tokens of one sequence whose cache holds
        context_len tokens (theirs included): q [Lq, Hq, D], written into out [Lq, Hq, D]."""
        raise NotImplementedError
