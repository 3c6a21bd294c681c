"""The decode fast path: every single-token row of a batch in one batched SDPA over K/V gathered
from the paged cache, in groups whose gather stays within a fixed number of keys."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tally.attention.backend import AttentionConfig
from tally.attention.workspace import Workspace

# Rows x keys gathered at once. Bounds the workspace at this many keys of K and of V (fp32):
# 32768 x Hkv x D x 4 bytes each, 24 MiB for SmolLM2's 3 x 64; 8 rows of 4k context fit in one group.
DECODE_GATHER_KEYS = 32768


def decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: list[int], config: AttentionConfig, workspace: Workspace,
    max_gather_keys: int = DECODE_GATHER_KEYS,
) -> torch.Tensor:
    """q [n, Hq, D] of n decode rows (row i has context_lens[i] tokens, its own included) ->
    [n, Hq, D] in the compute dtype."""
    window = config.sliding_window
    keys = context_lens if window is None else [min(c, window) for c in context_lens]
    if len(keys) * max(keys) <= max_gather_keys:
        return _decode_group(q, k_cache, v_cache, block_tables[:len(keys)], context_lens, config, workspace)
    # Longest first, so each group pads its rows only up to rows of similar length.
    order = sorted(range(len(keys)), key=keys.__getitem__, reverse=True)
    out = torch.empty(q.shape, dtype=config.compute_dtype, device=q.device)
    start = 0
    while start < len(order):
        size = max(1, max_gather_keys // keys[order[start]])
        rows = order[start:start + size]
        index = torch.tensor(rows, device=q.device)
        out[index] = _decode_group(
            q[index], k_cache, v_cache, block_tables[index], [context_lens[r] for r in rows], config,
            workspace,
        )
        start += size
    return out


def _decode_group(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: list[int], config: AttentionConfig, workspace: Workspace,
) -> torch.Tensor:
    """Each row's keys are laid out right-aligned in a [n, L] grid (the last column is the query's
    own position), with L = the longest context, or the window if that is shorter. Grid cells
    before position 0 are masked and point at the row's own (always written) slot, so slots never
    written - which may hold anything, even NaN - are never read."""
    block_size = k_cache.shape[1]
    num_keys = max(context_lens)
    if config.sliding_window is not None:
        num_keys = min(num_keys, config.sliding_window)
    ctx = torch.tensor(context_lens, dtype=torch.int64, device=k_cache.device)
    positions = ctx[:, None] - num_keys + torch.arange(num_keys, device=k_cache.device)
    valid = positions >= 0
    positions = torch.where(valid, positions, ctx[:, None] - 1)
    slots = block_tables.gather(1, positions // block_size) * block_size + positions % block_size
    k = _gather_slots(k_cache, slots, workspace, "k", config.compute_dtype)  # [n, L, Hkv, D]
    v = _gather_slots(v_cache, slots, workspace, "v", config.compute_dtype)
    mask = None if min(context_lens) >= num_keys else valid[:, None, None, :]
    out = F.scaled_dot_product_attention(
        q.to(config.compute_dtype).unsqueeze(2), k.transpose(1, 2), v.transpose(1, 2),
        attn_mask=mask, scale=config.scale, enable_gqa=config.num_queries_per_kv > 1,
    )
    return out.squeeze(2)


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
