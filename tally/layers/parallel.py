"""The tensor-parallel collectives a model's forward pass needs, on torch.distributed (gloo on CPU).

`TPGroup` is the ranks one layer is split over; `RowParallel` all-reduces a row-parallel projection's partial
sums; `VocabParallelHead` all-gathers each rank's vocabulary slice of the logits. The time spent inside the
collectives is counted, so benchmarks and the ledger can show the communication share of a step.
"""
from __future__ import annotations

import time
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
    comm_seconds: float = 0.0  # time inside collectives, since start
    comm_calls: int = 0

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        wait_polling(dist.all_reduce(t, group=self.group, async_op=True))
        self._count(start)
        return t

    def all_gather_columns(self, t: torch.Tensor, width: int, total: int) -> torch.Tensor:
        """[N, w ≤ width] from each rank → [N, total]: rank r's columns at r * width (each padded to `width`)."""
        start = time.perf_counter()
        if t.shape[1] < width:
            t = F.pad(t, (0, width - t.shape[1]))
        parts = [torch.empty_like(t) for _ in range(self.size)]
        wait_polling(dist.all_gather(parts, t.contiguous(), group=self.group, async_op=True))
        self._count(start)
        return torch.cat(parts, dim=1)[:, :total]

    def _count(self, start: float) -> None:
        self.comm_seconds += time.perf_counter() - start
        self.comm_calls += 1


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

    def __init__(self, inner: nn.Module, tp: TPGroup, rows: int, vocab_size: int) -> None:
        super().__init__()
        self.inner = inner
        self.tp = tp
        self.rows = rows
        self.vocab_size = vocab_size
        self.embedding_rows = getattr(inner, "embedding_rows", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_gather_columns(self.inner(x), self.rows, self.vocab_size)
