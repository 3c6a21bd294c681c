"""The tensor-parallel collectives a model's forward pass needs, on torch.distributed (gloo on CPU).

`TPGroup` is the ranks one layer is split over; `GatheredParallel` all-gathers a projection's split input, computes
this rank's outputs from it and all-gathers them, so every output is one rank's whole dot product (one process's
sums); `RowParallel` all-reduces partial sums instead (faster, other sums: only with batch_invariant off);
`VocabParallelHead` all-gathers each rank's vocabulary slice of the logits. The time spent inside the collectives is
counted, so benchmarks and the ledger can show the communication share of a step.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from tally.layers.spin_wait import wait_polling


@dataclass
class TPGroup:
    rank: int
    size: int
    group: dist.ProcessGroup | None = None  # None: the default (world) group
    partial_sums: bool = False  # o_proj and down_proj split by their inputs and all-reduced (batch_invariant off)
    comm_seconds: float = 0.0  # time inside collectives, since start
    comm_calls: int = 0

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        wait_polling(dist.all_reduce(t, group=self.group, async_op=True))
        self._count(start)
        return t

    def all_gather_columns(self, t: torch.Tensor, widths: Sequence[int]) -> torch.Tensor:
        """[N, widths[rank]] from each rank → [N, sum(widths)], rank by rank (each padded to the widest to travel)."""
        start = time.perf_counter()
        width = max(widths)
        if t.shape[1] < width:
            t = F.pad(t, (0, width - t.shape[1]))
        parts = [torch.empty_like(t) for _ in range(self.size)]
        wait_polling(dist.all_gather(parts, t.contiguous(), group=self.group, async_op=True))
        self._count(start)
        if all(w == width for w in widths):
            return torch.cat(parts, dim=1)
        return torch.cat([part[:, :w] for part, w in zip(parts, widths)], dim=1)

    def _count(self, start: float) -> None:
        self.comm_seconds += time.perf_counter() - start
        self.comm_calls += 1


class GatheredParallel(nn.Module):
    """A projection whose input arrives split across ranks (attention heads, MLP columns): the input all-gathered
    whole, this rank's output rows computed from it, the outputs all-gathered. Each output is then the same dot
    product, by the same kernel, as in one process: no partial sums are added in another order."""

    def __init__(self, inner: nn.Module, tp: TPGroup, in_widths: Sequence[int], out_widths: Sequence[int]) -> None:
        super().__init__()
        self.inner = inner
        self.tp = tp
        self.in_widths, self.out_widths = tuple(in_widths), tuple(out_widths)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        whole = self.tp.all_gather_columns(x, self.in_widths)
        return self.tp.all_gather_columns(self.inner(whole), self.out_widths)


class RowParallel(nn.Module):
    """A projection over this rank's input features; the ranks' partial outputs summed in place."""

    def __init__(self, inner: nn.Module, tp: TPGroup) -> None:
        super().__init__()
        self.inner = inner
        self.tp = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(self.inner(x))


class VocabParallelHead(nn.Module):
    """The LM head over this rank's vocabulary rows; every rank gets the whole [N, vocab_size] logits. A tied head
    still serves the embedding lookup of its own rows (`embedding_rows`)."""

    def __init__(self, inner: nn.Module, tp: TPGroup, widths: Sequence[int]) -> None:
        super().__init__()
        self.inner = inner
        self.tp = tp
        self.widths = tuple(widths)
        self.embedding_rows = getattr(inner, "embedding_rows", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_gather_columns(self.inner(x), self.widths)
