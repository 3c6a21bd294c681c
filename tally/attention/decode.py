"""The decode path off the native kernels: single-token rows attend over K/V gathered from the paged cache, in groups
of rows with as many keys whose gather stays within a fixed number of keys (a row alone through SDPA).

Which slots each row reads (the slot grid) depends only on the step's metadata, so
`plan_decode` builds it once per step and every layer reuses it (memoised on the metadata).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tally.attention.interface import AttentionConfig
from tally.attention.kv_cache import Int8KVCache, KVCache, dequantize_slots_into
from tally.attention.metadata import AttentionMetadata
from tally.attention.eager import eager_attention
from tally.attention.workspace import Workspace
from tally.native import ops as native

# Rows x keys gathered at once. Bounds the workspace at this many keys of K and of V (fp32):
# 32768 x Hkv x D x 4 bytes each, 24 MiB for SmolLM2's 3 x 64; 8 rows of 4k context fit in one group.
DECODE_GATHER_KEYS = 32768


@dataclass
class DecodeGroup:
    """Decode rows attended together, each with L keys (its context, or the window if that is shorter): a [n, L]
    grid of slots whose last column is each query's own position."""

    rows: torch.Tensor | None  # index into the decode rows; None: all of them, in order
    slots: torch.Tensor  # int64 [n, L] cache slot of each grid cell


def plan_decode(
    block_tables: torch.Tensor, context_lens: list[int], block_size: int, window: int | None,
    max_gather_keys: int, batched: bool = True,
) -> list[DecodeGroup]:
    """Rows grouped only with rows of as many keys, so no row is padded to another's length: padding would move
    where its keys fall in the kernels' blocks, and so its bits with the batch. `batched` False: a group a row (torch's
    SDPA gives a row other bits beside other rows even at equal lengths; its eager composition does not)."""
    keys = context_lens if window is None else [min(c, window) for c in context_lens]
    if batched and min(keys) == max(keys) and len(keys) * keys[0] <= max_gather_keys:
        return [_group(None, block_tables[:len(keys)], context_lens, block_size, window)]
    order = sorted(range(len(keys)), key=keys.__getitem__, reverse=True)
    groups, start = [], 0
    while start < len(order):
        size = max(1, max_gather_keys // keys[order[start]]) if batched else 1
        rows = [r for r in order[start:start + size] if keys[r] == keys[order[start]]]
        index = torch.tensor(rows, device=block_tables.device)
        groups.append(_group(index, block_tables[index], [context_lens[r] for r in rows], block_size, window))
        start += len(rows)
    return groups


def _group(
    rows: torch.Tensor | None, block_tables: torch.Tensor, context_lens: list[int], block_size: int,
    window: int | None,
) -> DecodeGroup:
    num_keys = context_lens[0] if window is None else min(context_lens[0], window)
    device = block_tables.device
    ctx = torch.tensor(context_lens, dtype=torch.int64, device=device)
    positions = ctx[:, None] - num_keys + torch.arange(num_keys, device=device)
    slots = block_tables.gather(1, positions // block_size) * block_size + positions % block_size
    return DecodeGroup(rows, slots)


def native_attention_supported(k_cache: KVCache, config: AttentionConfig) -> bool:
    """The C kernels (tally/native: decode rows, and a prompt's rows in auto.py) read an fp32, fp16, bf16 or int8
    cache in place, through the block tables, with fp32 arithmetic (bf16 compute: q widened, outputs rounded): no
    gather copy and one call per layer instead of a dozen. Soft caps and sinks included."""
    return (config.compute_dtype in (torch.float32, torch.bfloat16) and native.vector_supported(config.head_dim)
            and native.available()
            and (isinstance(k_cache, Int8KVCache) or k_cache.dtype in native.KV_KINDS))


def native_decode_attention(q: torch.Tensor, k_cache: KVCache, v_cache: KVCache, block_tables: torch.Tensor,
                            context_lens: torch.Tensor, config: AttentionConfig,
                            out: torch.Tensor | None = None) -> torch.Tensor:
    """native.decode_attention over any cache native_attention_supported takes: each row's keys in one order,
    whatever the other rows, so a row's bits do not depend on the batch."""
    scales = None
    if isinstance(k_cache, Int8KVCache):
        scales, k_cache, v_cache = (k_cache.scales, v_cache.scales), k_cache.values, v_cache.values
    return native.decode_attention(q, k_cache, v_cache, block_tables, context_lens, config.sliding_window,
                                   config.scale, config.logit_softcap, config.sink_logits(), out, scales)


def decode_attention(
    q: torch.Tensor, k_cache: KVCache, v_cache: KVCache, meta: AttentionMetadata,
    config: AttentionConfig, workspace: Workspace, max_gather_keys: int = DECODE_GATHER_KEYS,
) -> torch.Tensor:
    """q [n, Hq, D] of the n = meta.num_decode_tokens decode rows -> [n, Hq, D] in the compute dtype."""
    n = q.shape[0]
    if native_attention_supported(k_cache, config):
        lens = meta.memo("context_lens", lambda: torch.tensor(meta.context_lens[:n], dtype=torch.int64))
        return native_decode_attention(q.float(), k_cache, v_cache, meta.block_tables, lens, config)
    groups = meta.memo(
        ("decode", config.sliding_window, max_gather_keys, config.eager),
        lambda: plan_decode(meta.block_tables, meta.context_lens[:n], meta.block_size,
                            config.sliding_window, max_gather_keys, batched=config.eager),
    )
    if groups[0].rows is None:
        return _attend(q, k_cache, v_cache, groups[0], config, workspace)
    out = torch.empty(q.shape, dtype=config.compute_dtype, device=q.device)
    for group in groups:
        out[group.rows] = _attend(q[group.rows], k_cache, v_cache, group, config, workspace)
    return out


def _attend(
    q: torch.Tensor, k_cache: KVCache, v_cache: KVCache, group: DecodeGroup, config: AttentionConfig,
    workspace: Workspace,
) -> torch.Tensor:
    k = _gather_slots(k_cache, group, workspace, "k", config.compute_dtype)  # [n, L, Hkv, D]
    v = _gather_slots(v_cache, group, workspace, "v", config.compute_dtype)
    if config.eager:
        out = eager_attention(q.to(config.compute_dtype).unsqueeze(2), k.transpose(1, 2), v.transpose(1, 2),
                              None, config.scale, config.logit_softcap, config.sink_logits())
        return out.squeeze(2)
    out = F.scaled_dot_product_attention(
        q.to(config.compute_dtype).unsqueeze(2), k.transpose(1, 2), v.transpose(1, 2),
        scale=config.scale, enable_gqa=config.num_queries_per_kv > 1,
    )
    return out.squeeze(2)


def _gather_slots(
    cache: KVCache, group: DecodeGroup, workspace: Workspace, name: str, dtype: torch.dtype,
) -> torch.Tensor:
    """cache rows at the group's slots [n, L] -> [n, L, Hkv, D] in dtype, in reused workspace buffers."""
    slots = group.slots.view(-1)
    row_shape = cache.shape[2:]
    shape = (*group.slots.shape, *row_shape)
    if isinstance(cache, Int8KVCache):
        values = workspace.get(name + "_int8", (len(slots), *row_shape), torch.int8, cache.device)
        scales = workspace.get(name + "_scales", (len(slots), row_shape[0]), torch.float32, cache.device)
        out = workspace.get(name + "_compute", (len(slots), *row_shape), dtype, cache.device)
        return dequantize_slots_into(cache, slots, values, scales, out).view(shape)
    # index_select, not cache[slots]: advanced indexing is several times slower on CPU.
    out = workspace.get(name, shape, cache.dtype, cache.device)
    torch.index_select(cache.view(-1, *row_shape), 0, slots, out=out.view(-1, *row_shape))
    if dtype == cache.dtype:
        return out
    return workspace.get(name + "_compute", shape, dtype, cache.device).copy_(out)
