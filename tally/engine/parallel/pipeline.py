"""A step through the pipeline stages: rank 0's step cut into micro-batches that the stages work on at once."""
from __future__ import annotations

import time
from bisect import bisect_left
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from tally.attention.kv_cache import KVCache
from tally.engine.model_step import ModelStep, run_model_step
from tally.layers.spin_wait import wait_polling
from tally.models.decoder import CausalLM


@dataclass
class TransferClock:
    seconds: float = 0.0  # rank 0: transfer time of every micro-batch at every boundary, since start
    carried: float = 0.0  # the last stage: transfer time met by micro-batches that sent no logits yet


@dataclass(frozen=True)
class PipelinePeers:
    """A step's sequences are cut into as many contiguous micro-batches as there are stages, by tokens (each keeps the
    decodes-first order attention needs). Stage s runs each micro-batch in turn: the hidden state [T, H] from stage s-1
    (stage 0 embeds instead), its own layers, then an asynchronous send to stage s+1, so it starts on the next
    micro-batch while s+1 works on this one. The last stage computes each micro-batch's logit rows and sends them to
    rank 0, which puts them back in the step's order. Under TP x PP the hidden states go between the same TP rank of
    adjacent stages, and the last stage's TP rank 0 alone sends logits.

    A send is a broadcast in a process group of the two ranks (one group a direction, so each keeps its order), not
    gloo's point-to-point send: a receive is then a collective the receiver can poll (tally/layers/spin_wait.py), where
    gloo marks a point-to-point receive complete only inside its blocking wait, and a rank asleep there wakes late.

    Every transfer carries one extra row: the sender's clock when it started the send, and the transfer time the
    micro-batch met upstream. The receiver counts what it waited beyond the moment both sides were ready (its own
    arrival or the send's start, whichever was later): the transfer, without the other stage's work. The last stage
    forwards the sum with the logits, so rank 0 holds every stage boundary's time (`TransferClock`), as TPGroup holds
    its collectives'. The clocks are CLOCK_MONOTONIC, one clock for the ranks of one machine; across machines the figure
    is not a transfer.

    Rank `rank`'s place in a tp x pp world, vLLM's layout: rank = stage * tp_size + TP rank."""

    rank: int
    tp_size: int
    num_stages: int
    from_prev: dist.ProcessGroup | None = None  # {prev_rank, rank}: hidden states in
    to_next: dist.ProcessGroup | None = None  # {rank, next_rank}: hidden states out
    logits: dist.ProcessGroup | None = None  # {logits_rank, 0}, on those two ranks
    clock: TransferClock = field(default_factory=TransferClock)

    @property
    def stage(self) -> int:
        return self.rank // self.tp_size

    @property
    def prev_rank(self) -> int | None:
        return self.rank - self.tp_size if self.stage > 0 else None

    @property
    def next_rank(self) -> int | None:
        return self.rank + self.tp_size if self.stage < self.num_stages - 1 else None

    @property
    def logits_rank(self) -> int:
        """The rank that sends rank 0 the logits: the last stage's TP rank 0."""
        return (self.num_stages - 1) * self.tp_size


@dataclass
class MicroBatch:
    step: ModelStep  # its own rows, metadata and logit rows (relative to its first row)
    logit_index: torch.Tensor  # where its logit rows go among the whole step's


def split_step(step: ModelStep, parts: int) -> list[MicroBatch]:
    """Up to `parts` micro-batches of whole sequences with about equal tokens; none empty."""
    starts = step.meta.query_start_loc
    total, num_seqs = starts[-1], len(starts) - 1
    cuts = sorted({0, num_seqs, *(min(bisect_left(starts, total * k / parts), num_seqs) for k in range(1, parts))})
    batches = []
    for a, b in zip(cuts, cuts[1:]):
        lo, hi = starts[a], starts[b]
        index = ((step.logit_rows >= lo) & (step.logit_rows < hi)).nonzero().flatten()
        part = ModelStep(step.input_ids[lo:hi], step.positions[lo:hi], step.meta.sequences(a, b),
                         step.logit_rows[index] - lo)
        batches.append(MicroBatch(part, index))
    return batches


def forward_step(model: CausalLM, kv_caches: list[tuple[KVCache, KVCache]], step: ModelStep,
                 peers: PipelinePeers | None) -> torch.Tensor | None:
    """The step's float32 logits [len(logit_rows), V] on rank 0 (on every rank without a pipeline); None on the
    other ranks of a pipeline."""
    if peers is None:
        return run_model_step(model, kv_caches, step)
    return _run_stage(model, kv_caches, step, peers)


@torch.inference_mode()
def _run_stage(model: CausalLM, kv_caches: list[tuple[KVCache, KVCache]], step: ModelStep,
               peers: PipelinePeers) -> torch.Tensor | None:
    batches = split_step(step, peers.num_stages)
    sending = []  # (work, the tensor it reads): a tensor must live until its send completes
    for mb in batches:
        hidden, upstream = None, 0.0
        if peers.prev_rank is not None:
            hidden, upstream = _receive(len(mb.step.input_ids), model.cfg.hidden_size, model.dtype, peers.prev_rank,
                                        peers.from_prev)
        out = model(mb.step.input_ids, mb.step.positions, kv_caches, mb.step.meta, hidden)
        if peers.next_rank is not None:
            sending.append(_send(out, model.dtype, upstream, peers.rank, peers.to_next))
        else:
            peers.clock.carried += upstream
            if len(mb.step.logit_rows):
                logits = model.compute_logits(out[mb.step.logit_rows])
                if peers.rank == peers.logits_rank:
                    sending.append(_send(logits, torch.float32, peers.clock.carried, peers.rank, peers.logits))
                peers.clock.carried = 0.0
    for work, _ in sending:
        work.wait()
    if peers.rank != 0:
        return None
    logits = torch.empty(len(step.logit_rows), model.cfg.vocab_size, dtype=torch.float32)
    for mb in batches:
        if len(mb.logit_index):
            logits[mb.logit_index], upstream = _receive(len(mb.logit_index), model.cfg.vocab_size, torch.float32,
                                                        peers.logits_rank, peers.logits)
            peers.clock.seconds += upstream
    return logits


def _send(rows: torch.Tensor, dtype: torch.dtype, upstream: float, rank: int,
          group: dist.ProcessGroup) -> tuple[dist.Work, torch.Tensor]:
    """Start sending `rows` and the clock row; the tensor the send reads, to keep until it completes."""
    buf = torch.empty(len(rows) + 1, rows.shape[1], dtype=dtype)
    buf[:-1] = rows
    write_clock(buf[-1], time.monotonic(), upstream)
    return dist.broadcast(buf, src=rank, group=group, async_op=True), buf


def _receive(n: int, width: int, dtype: torch.dtype, src: int, group: dist.ProcessGroup) -> tuple[torch.Tensor, float]:
    """The `n` rows `src` sends, and the transfer time met so far: upstream's and this wait's beyond the moment both
    sides were ready."""
    buf = torch.empty(n + 1, width, dtype=dtype)
    arrived = time.monotonic()
    wait_polling(dist.broadcast(buf, src=src, group=group, async_op=True))
    done = time.monotonic()
    sent, upstream = read_clock(buf[-1])
    return buf[:-1], upstream + max(done - max(sent, arrived), 0.0)


def write_clock(row: torch.Tensor, sent: float, upstream: float) -> None:
    """Two float64s in the first 16 bytes of a row of any dtype (a row is never narrower: hidden sizes are ≥ 8)."""
    row.view(torch.uint8)[:16] = torch.tensor([sent, upstream], dtype=torch.float64).view(torch.uint8)


def read_clock(row: torch.Tensor) -> tuple[float, float]:
    sent, upstream = row.view(torch.uint8)[:16].clone().view(torch.float64).tolist()  # clone: 8-byte aligned
    return sent, upstream
