"""Shared by the test_attention*.py files (no tests here): a toy paged KV cache and a dense oracle.

Block ids are handed out shuffled and block 0 is never handed out (it is the block tables'
padding), and every slot starts as NaN: a backend that reads a slot it should not read shows NaN.
An int8 cache (dtype=torch.int8) starts with garbage values and NaN scales for the same reason.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from tally.attention import AttentionMetadata
from tally.attention.kv_cache import Int8KVCache, write_int8


@dataclass
class Seq:
    """One sequence's full q/k/v (rotary already applied), all positions 0..len-1."""

    q: torch.Tensor  # [L, Hq, D]
    k: torch.Tensor  # [L, Hkv, D]
    v: torch.Tensor


def random_seq(length: int, hq: int, hkv: int, d: int, gen: torch.Generator) -> Seq:
    return Seq(*(torch.randn(length, h, d, generator=gen) for h in (hq, hkv, hkv)))


class PagedKV:
    def __init__(self, hkv: int, d: int, block_size: int, num_blocks: int = 256,
                 dtype: torch.dtype = torch.float32, seed: int = 0) -> None:
        self.block_size = block_size
        shape = (num_blocks, block_size, hkv, d)
        if dtype == torch.int8:
            gen = torch.Generator().manual_seed(seed)
            self.k_cache, self.v_cache = (
                Int8KVCache(torch.randint(-127, 128, shape, dtype=torch.int8, generator=gen),
                            torch.full((num_blocks, block_size, hkv), float("nan")))
                for _ in range(2))
        else:
            self.k_cache = torch.full(shape, float("nan"), dtype=dtype)
            self.v_cache = torch.full_like(self.k_cache, float("nan"))
        self.free = list(range(1, num_blocks))
        random.Random(seed).shuffle(self.free)
        self.tables: dict[int, list[int]] = {}  # id(seq) -> its block ids

    def blocks(self, seq: Seq) -> list[int]:
        return self.tables.setdefault(id(seq), [])

    def slots(self, seq: Seq, start: int, end: int) -> list[int]:
        blocks = self.blocks(seq)
        while len(blocks) * self.block_size < end:
            blocks.append(self.free.pop())
        return [blocks[p // self.block_size] * self.block_size + p % self.block_size
                for p in range(start, end)]

    def prewrite(self, seq: Seq, end: int) -> None:
        """Put positions [0, end) in the cache directly, as an earlier step or a prefix hit would."""
        slots = torch.tensor(self.slots(seq, 0, end), dtype=torch.int64)
        if isinstance(self.k_cache, Int8KVCache):
            write_int8(self.k_cache, seq.k[:end], slots)
            write_int8(self.v_cache, seq.v[:end], slots)
            return
        self.k_cache.view(-1, *self.k_cache.shape[2:])[slots] = seq.k[:end].to(self.k_cache.dtype)
        self.v_cache.view(-1, *self.v_cache.shape[2:])[slots] = seq.v[:end].to(self.v_cache.dtype)

    def step(self, backend, rows: list[tuple[Seq, int, int]], *, prewrite: bool = True,
             num_decodes: int | None = None) -> list[torch.Tensor]:
        """Run one forward for rows of (seq, computed, new); returns each row's output [new, Hq, D].
        The leading rows with new == 1 are the decodes unless num_decodes says otherwise."""
        if num_decodes is None:
            num_decodes = 0
            while num_decodes < len(rows) and rows[num_decodes][2] == 1:
                num_decodes += 1
        starts, slot_mapping, qs, ks, vs = [0], [], [], [], []
        for seq, computed, new in rows:
            if prewrite and computed:
                self.prewrite(seq, computed)
            slot_mapping += self.slots(seq, computed, computed + new)
            starts.append(starts[-1] + new)
            for out, src in ((qs, seq.q), (ks, seq.k), (vs, seq.v)):
                out.append(src[computed:computed + new])
        width = max(len(self.blocks(seq)) for seq, _, _ in rows) + 2  # extra padding on purpose
        tables = torch.zeros(len(rows), width, dtype=torch.int64)
        for b, (seq, _, _) in enumerate(rows):
            tables[b, :len(self.blocks(seq))] = torch.tensor(self.blocks(seq))
        meta = AttentionMetadata(
            query_start_loc=starts, context_lens=[c + n for _, c, n in rows], block_tables=tables,
            slot_mapping=torch.tensor(slot_mapping, dtype=torch.int64), block_size=self.block_size,
            num_decode_tokens=num_decodes,
        )
        out = backend.forward(torch.cat(qs), torch.cat(ks), torch.cat(vs), self.k_cache, self.v_cache, meta)
        return [out[starts[b]:starts[b + 1]] for b in range(len(rows))]


def dense_oracle(seq: Seq, computed: int, new: int, *, scale: float, window: int | None,
                 kv_dtype: torch.dtype = torch.float32, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Full [Hq, new, ctx] score matrix in float64 with explicit causal and window masks; `sinks` [Hq]: each head's
    logit added to its softmax's denominator."""
    ctx = computed + new
    group = seq.q.shape[1] // seq.k.shape[1]
    q = seq.q[computed:ctx].double()
    k = seq.k[:ctx].to(kv_dtype).double().repeat_interleave(group, dim=1)
    v = seq.v[:ctx].to(kv_dtype).double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    query_pos = torch.arange(computed, ctx)[:, None]
    key_pos = torch.arange(ctx)[None, :]
    allowed = key_pos <= query_pos
    if window is not None:
        allowed &= key_pos > query_pos - window
    scores = scores.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        scores = torch.cat([scores, sinks.double()[:, None, None].expand(-1, new, 1)], dim=-1)
    probs = scores.softmax(dim=-1)[..., :ctx]
    return torch.einsum("hqk,khd->qhd", probs, v)
