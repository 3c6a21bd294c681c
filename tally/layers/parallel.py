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


class WholeHeads:
    """All heads' q and k of each token on every rank, for norms over the whole projection (OLMo 2), which no rank's
    slice holds: one all-gather of each rank's q and k side by side; a KV head replicated on several ranks is taken
    once, from the first. `kv_starts`: each rank's first KV head."""

    def __init__(self, tp: TPGroup, q_widths: Sequence[int], kv_widths: Sequence[int], kv_starts: Sequence[int],
                 head_dim: int) -> None:
        self.tp = tp
        self.q_widths, self.kv_widths = tuple(q_widths), tuple(kv_widths)
        self.widths = tuple(q + k for q, k in zip(q_widths, kv_widths))
        self.keep_kv, covered = [], 0
        for start, width in zip(kv_starts, kv_widths):
            self.keep_kv.append(start == covered)
            covered += width // head_dim if start == covered else 0
        self.q_size = sum(q_widths)
        self.q_span = (sum(q_widths[:tp.rank]), sum(q_widths[:tp.rank + 1]))
        k_start = kv_starts[tp.rank] * head_dim
        self.k_span = (self.q_size + k_start, self.q_size + k_start + kv_widths[tp.rank])

    def gather(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """This rank's q [T, q] and k [T, k] -> [T, Q + K]: every rank's q, then every distinct KV head's k."""
        parts = self.tp.all_gather_columns(torch.cat([q, k], dim=1), self.widths).split(self.widths, dim=1)
        qs = [part[:, :w] for part, w in zip(parts, self.q_widths)]
        ks = [part[:, w:] for part, w, keep in zip(parts, self.q_widths, self.keep_kv) if keep]
        return torch.cat(qs + ks, dim=1)

    def own(self, whole: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's q and k columns of [T, Q + K]."""
        return whole[:, self.q_span[0]:self.q_span[1]], whole[:, self.k_span[0]:self.k_span[1]]
