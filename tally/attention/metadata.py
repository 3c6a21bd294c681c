"""What one forward step tells attention about its batch: a flat varlen batch over a paged KV cache."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Hashable, TypeVar

import torch

T = TypeVar("T")


@dataclass
class AttentionMetadata:
    """A flat varlen batch of B sequences with T = sum(query_lens) new tokens this step.

    The batch is ordered decodes first (query_len == 1; a speculative verify's positions come as
    decodes too, one query each: tally/engine/inputs.py), then prefills / prefill chunks;
    `num_decode_tokens` counts the decodes, which are also the first `num_decode_tokens` sequences.
    """

    query_start_loc: list[int]
    """len B+1, cumulative query lengths (python ints, CPU)."""
    context_lens: list[int]
    """len B: tokens in the cache for each sequence AFTER this step's writes (already computed +
    this step's new tokens). Query token i of sequence b sits at absolute position
    context_lens[b] - query_len_b + i."""
    block_tables: torch.Tensor
    """int64 [B, max_blocks_per_seq], padded with 0 beyond each sequence's blocks."""
    slot_mapping: torch.Tensor
    """int64 [T]: cache slot (block_id * block_size + offset) of each new token's K/V."""
    block_size: int
    num_decode_tokens: int = 0
    step_cache: dict[Hashable, object] = field(default_factory=dict, repr=False, compare=False)
    """Tensors derived from the fields above (decode slot grids, masks, int8 write plans): every
    layer of a step needs the same ones, so the first layer builds them and the rest reuse them."""

    def memo(self, key: Hashable, build: Callable[[], T]) -> T:
        """build(), once per step for each key; the key names whatever else the value depends on."""
        if key not in self.step_cache:
            self.step_cache[key] = build()
        return self.step_cache[key]  # type: ignore[return-value]

    def sequences(self, start: int, end: int) -> AttentionMetadata:
        """Sequences [start, end) as a batch of their own (a pipeline micro-batch): still decodes first."""
        first, last = self.query_start_loc[start], self.query_start_loc[end]
        return AttentionMetadata(
            query_start_loc=[q - first for q in self.query_start_loc[start:end + 1]],
            context_lens=self.context_lens[start:end], block_tables=self.block_tables[start:end],
            slot_mapping=self.slot_mapping[first:last], block_size=self.block_size,
            num_decode_tokens=max(0, min(self.num_decode_tokens, end) - start))

    @property
    def num_seqs(self) -> int:
        return len(self.context_lens)

    @property
    def is_decode_only(self) -> bool:
        return self.num_decode_tokens == self.num_seqs
