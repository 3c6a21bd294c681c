"""int8 KV cache: int8 values with one float32 scale per (block, KV head), for one layer's K or V.

This is the layout tally/ledger/kv.py counts (bytes_per_block includes the scales). Scales are
symmetric (value = q * scale, q in -127..127) and grow as a block fills over several steps: when a
new token's absmax for a (block, head) exceeds 127 x the current scale, that block-head's earlier
values are requantized to the larger scale first, in one vectorised pass over the blocks written
this step. A write at a block's first slot starts it afresh: whatever the block held belonged to a
previous owner (the allocator fills a request's blocks in position order, and shared prefix blocks
are full, so never written again).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import torch

QMAX = 127
# A block-head of all zeros still gets a positive scale, so dividing by it is safe.
MIN_SCALE = 1e-12


@dataclass
class Int8KVCache:
    """One layer's K (or V): values int8 [num_blocks, block_size, Hkv, D], scales float32 [num_blocks, Hkv]."""

    values: torch.Tensor
    scales: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.values.shape

    @property
    def device(self) -> torch.device:
        return self.values.device


KVCache = Union[torch.Tensor, Int8KVCache]
"""What attention backends receive per layer for K and for V: a plain tensor (fp32 / bf16) or int8."""


@dataclass
class WritePlan:
    """Which blocks one step writes; the same for every layer and for K and V, so built once per step."""

    blocks: torch.Tensor  # int64 [U] distinct blocks written
    token_block: torch.Tensor | None  # int64 [T] index into `blocks` of each token; None: token i is block i
    kept: torch.Tensor  # bool [U, 1] the block already holds this owner's values (write starts past slot 0)
    fresh: torch.Tensor  # bool [U, 1] ~kept: the block's old values and scale are a previous owner's


def plan_writes(slot_mapping: torch.Tensor, block_size: int) -> WritePlan:
    blocks, token_block = torch.unique(slot_mapping // block_size, return_inverse=True)
    first_offset = torch.full_like(blocks, block_size).scatter_reduce_(
        0, token_block, slot_mapping % block_size, "amin")
    if len(blocks) == len(slot_mapping):  # one token per block, as in decode steps: keep token order
        blocks, token_block, first_offset = slot_mapping // block_size, None, slot_mapping % block_size
    kept = (first_offset > 0)[:, None]
    return WritePlan(blocks, token_block, kept, ~kept)


def write_int8(cache: Int8KVCache, x: torch.Tensor, slot_mapping: torch.Tensor, plan: WritePlan) -> None:
    """Quantize new tokens x [T, Hkv, D] into their slots, growing block-head scales as needed."""
    x = x.float()
    absmax = torch.linalg.vector_norm(x, float("inf"), dim=-1)  # [T, Hkv]
    if plan.token_block is not None:
        absmax = torch.zeros(len(plan.blocks), x.shape[1], device=x.device).scatter_reduce_(
            0, plan.token_block[:, None].expand(-1, x.shape[1]), absmax, "amax")
    old_scale = cache.scales.index_select(0, plan.blocks).masked_fill_(plan.fresh, 0.0)
    scale = torch.maximum(old_scale, absmax.div_(QMAX)).clamp_min_(MIN_SCALE)
    # Blocks already holding this owner's values whose scale grows: rescale those values first.
    grown = (scale > old_scale).logical_and_(plan.kept).any(dim=1).nonzero().squeeze(1)
    if grown.numel():
        ids = plan.blocks.index_select(0, grown)
        ratio = (old_scale.index_select(0, grown) / scale.index_select(0, grown))[:, None, :, None]
        old = cache.values.index_select(0, ids).float().mul_(ratio).round_()
        cache.values.index_copy_(0, ids, old.to(torch.int8))
    token_scale = scale if plan.token_block is None else scale.index_select(0, plan.token_block)
    # |x| <= absmax = 127 x scale, so no clamp is needed.
    q = torch.div(x, token_scale[..., None]).round_().to(torch.int8)
    cache.values.view(-1, *cache.values.shape[2:]).index_copy_(0, slot_mapping, q)
    cache.scales.index_copy_(0, plan.blocks, scale)


def dequantize_blocks(cache: Int8KVCache, block_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Whole blocks [n, block_size, Hkv, D] in dtype."""
    values = cache.values.index_select(0, block_ids).to(dtype)
    return values.mul_(cache.scales.index_select(0, block_ids).to(dtype)[:, None, :, None])


def dequantize_slots_into(
    cache: Int8KVCache, slots: torch.Tensor, slot_blocks: torch.Tensor, values_buf: torch.Tensor,
    scales_buf: torch.Tensor, out: torch.Tensor,
) -> torch.Tensor:
    """Rows at flat slots [N] (their blocks slot_blocks [N]) -> out [N, Hkv, D], through caller-owned
    buffers values_buf int8 [N, Hkv, D] and scales_buf float32 [N, Hkv] so nothing is allocated."""
    torch.index_select(cache.values.view(-1, *cache.values.shape[2:]), 0, slots, out=values_buf)
    torch.index_select(cache.scales, 0, slot_blocks, out=scales_buf)
    # copy_ then mul_: a mixed int8 x float mul would allocate a float copy of the values first.
    return out.copy_(values_buf).mul_(scales_buf[..., None])
