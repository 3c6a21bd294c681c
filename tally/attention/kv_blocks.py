"""Whole KV blocks out of the pool and back, for the swap space and the disk prefix tier: a block's K and V in every
layer (int8 caches: values and scales) as one row of bytes.

`ExactBlocks` keeps the bytes as the pool holds them. `Int8Blocks` stores a float pool's blocks in int8 with one
scale per (block, layer, K/V, KV head) (the int8 cache keeps one per token: tally/attention/kv_cache.py): 4x (fp32)
or 2x (bf16) fewer bytes, but lossy: a request that went through it may not continue exactly as it would have."""
from __future__ import annotations

from collections.abc import Iterator

import torch

from tally.attention.kv_cache import MIN_SCALE, QMAX, Int8KVCache, KVCache


def block_tensors(kv_caches: list[tuple[KVCache, KVCache]]) -> list[torch.Tensor]:
    """Every pool tensor whose first dimension is the block, in a fixed order."""
    out = []
    for pair in kv_caches:
        for cache in pair:
            out += [cache.values, cache.scales] if isinstance(cache, Int8KVCache) else [cache]
    return out


def copy_block(tensors: list[torch.Tensor], src: int, dst: int) -> None:
    """Block `src` of every pool tensor copied over block `dst`."""
    for t in tensors:
        t[dst].copy_(t[src])


def _columns(data: torch.Tensor, widths: list[int]) -> Iterator[torch.Tensor]:
    """Consecutive column ranges of uint8 rows [n, sum(widths)], each made contiguous for a dtype view."""
    offset = 0
    for w in widths:
        yield data[:, offset:offset + w].contiguous()
        offset += w


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(len(t), -1).view(torch.uint8)


class ExactBlocks:
    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.tensors = tensors
        self.widths = [t[0].numel() * t.element_size() for t in tensors]
        self.nbytes = sum(self.widths)  # per block
        self.layout = [(str(t.dtype), tuple(t.shape[1:])) for t in tensors]  # what the rows mean, for names on disk

    def read(self, block_ids: torch.Tensor) -> torch.Tensor:
        """The blocks as uint8 rows [n, nbytes] (a copy: the pool may hand the blocks out again)."""
        return torch.cat([_as_bytes(t.index_select(0, block_ids)) for t in self.tensors], dim=1)

    def write(self, block_ids: torch.Tensor, data: torch.Tensor) -> None:
        for t, part in zip(self.tensors, _columns(data, self.widths)):
            t.index_copy_(0, block_ids, part.view(t.dtype).view(len(block_ids), *t.shape[1:]))


class Int8Blocks:
    """For a float pool ([num_blocks, block_size, Hkv, D] per layer's K and V): int8 values, float32 scale per head."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        assert all(t.is_floating_point() for t in tensors), "an int8 pool's blocks are copied as they are"
        self.tensors = tensors
        self.widths = [w for t in tensors for w in (t[0].numel(), t.shape[2] * 4)]  # values, then scales
        self.nbytes = sum(self.widths)

    def read(self, block_ids: torch.Tensor) -> torch.Tensor:
        parts = []
        for t in self.tensors:
            x = t.index_select(0, block_ids).float()  # [n, block_size, Hkv, D]
            scale = x.abs().amax(dim=(1, 3)).div_(QMAX).clamp_min_(MIN_SCALE)  # [n, Hkv]
            q = x.div_(scale[:, None, :, None]).round_().to(torch.int8)
            parts += [_as_bytes(q), _as_bytes(scale)]
        return torch.cat(parts, dim=1)

    def write(self, block_ids: torch.Tensor, data: torch.Tensor) -> None:
        columns = list(_columns(data, self.widths))
        for t, q, scale in zip(self.tensors, columns[0::2], columns[1::2]):
            x = q.view(torch.int8).view(len(block_ids), *t.shape[1:]).float()
            t.index_copy_(0, block_ids, x.mul_(scale.view(torch.float32)[:, None, :, None]).to(t.dtype))
