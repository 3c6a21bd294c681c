"""int8 KV cache: int8 values with one float32 scale per (token, KV head), for one layer's K or V.

This is the layout tally/ledger/kv.py counts (bytes_per_block includes the scales). Scales are symmetric
(value = q * scale, q in -127..127) and each token's come from its own values alone, so what a token leaves in
the cache does not depend on which tokens were written with it or before it: a prompt's cache is the same bits
chunked or in one pass, alone or in a batch (docs/server.md#reproducibility). A per-block scale that grows as the
block fills would requantize earlier values at chunk boundaries the batch decides.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import torch

QMAX = 127
# A token-head of all zeros still gets a positive scale, so dividing by it is safe.
MIN_SCALE = 1e-12


@dataclass
class Int8KVCache:
    """One layer's K (or V): values int8 [num_blocks, block_size, Hkv, D], scales float32 [num_blocks, block_size,
    Hkv]."""

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


def write_int8(cache: Int8KVCache, x: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Quantize new tokens x [T, Hkv, D] into their slots, each (token, head) on its own scale."""
    x = x.float()
    scale = torch.linalg.vector_norm(x, float("inf"), dim=-1).div_(QMAX).clamp_min_(MIN_SCALE)  # [T, Hkv]
    # |x| <= absmax = 127 x scale, so no clamp is needed.
    q = torch.div(x, scale[..., None]).round_().to(torch.int8)
    cache.values.view(-1, *cache.values.shape[2:]).index_copy_(0, slot_mapping, q)
    cache.scales.view(-1, x.shape[1]).index_copy_(0, slot_mapping, scale)


def dequantize_blocks(cache: Int8KVCache, block_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Whole blocks [n, block_size, Hkv, D] in dtype."""
    values = cache.values.index_select(0, block_ids).to(dtype)
    return values.mul_(cache.scales.index_select(0, block_ids).to(dtype)[..., None])


def dequantize_slots_into(
    cache: Int8KVCache, slots: torch.Tensor, values_buf: torch.Tensor, scales_buf: torch.Tensor, out: torch.Tensor,
) -> torch.Tensor:
    """Rows at flat slots [N] -> out [N, Hkv, D], through caller-owned
    buffers values_buf int8 [N, Hkv, D] and scales_buf float32 [N, Hkv] so nothing is allocated."""
    torch.index_select(cache.values.view(-1, *cache.values.shape[2:]), 0, slots, out=values_buf)
    torch.index_select(cache.scales.view(-1, cache.scales.shape[2]), 0, slots, out=scales_buf)
    # copy_ then mul_: a mixed int8 x float mul would allocate a float copy of the values first.
    return out.copy_(values_buf).mul_(scales_buf[..., None])
