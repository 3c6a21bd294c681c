"""A step through the pipeline stages: rank 0's step cut into micro-batches that the stages work on at once.

A step's sequences are cut into as many contiguous micro-batches as there are stages, by tokens (each keeps the
decodes-first order attention needs). Stage s runs each micro-batch in turn: the hidden state [T, H] from stage s-1
(stage 0 embeds instead), its own layers, then an asynchronous send to stage s+1, so it starts on the next
micro-batch while s+1 works on this one. The last stage computes each micro-batch's logit rows and sends them to
rank 0, which puts them back in the step's order. Under TP x PP the hidden states go between the same TP rank of
adjacent stages, and the last stage's TP rank 0 alone sends logits.

A send is a broadcast in a process group of the two ranks (one group a direction, so each keeps its order), not
gloo's point-to-point send: a receive is then a collective the receiver can poll (tally/layers/spin_wait.py), where
gloo marks a point-to-point receive complete only inside its blocking wait, and a rank asleep there wakes late.
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

import torch
import torch.distributed as dist

from tally.attention.kv_cache import KVCache
from tally.engine.model_step import ModelStep, run_model_step
from tally.layers.spin_wait import wait_polling
from tally.models.llama import CausalLM


@dataclass(frozen=True)
class PipelinePeers:
    """Rank `rank`'s place in a tp x pp world, vLLM's layout: rank = stage * tp_size + TP rank."""

    rank: int
    tp_size: int
    num_stages: int
    from_prev: dist.ProcessGroup | None = None  # {prev_rank, rank}: hidden states in
    to_next: dist.ProcessGroup | None = None  # {rank, next_rank}: hidden states out
    logits: dist.ProcessGroup | None = None  # {logits_rank, 0}, on those two ranks

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
    vocab = model.cfg.vocab_size
    sending = []  # (work, the tensor it reads): a tensor must live until its send completes
    for mb in batches:
        hidden = None
        if peers.prev_rank is not None:
            hidden = torch.empty(len(mb.step.input_ids), model.cfg.hidden_size, dtype=model.dtype)
            wait_polling(dist.broadcast(hidden, src=peers.prev_rank, group=peers.from_prev, async_op=True))
        out = model(mb.step.input_ids, mb.step.positions, kv_caches, mb.step.meta, hidden)
        if peers.next_rank is not None:
            out = out.to(model.dtype).contiguous()  # the shape and dtype the next stage receives into
            sending.append((dist.broadcast(out, src=peers.rank, group=peers.to_next, async_op=True), out))
        elif len(mb.step.logit_rows):
            logits = model.compute_logits(out[mb.step.logit_rows]).contiguous()
            if peers.rank == peers.logits_rank:
                sending.append((dist.broadcast(logits, src=peers.rank, group=peers.logits, async_op=True), logits))
    for work, _ in sending:
        work.wait()
    if peers.rank != 0:
        return None
    logits = torch.empty(len(step.logit_rows), vocab, dtype=torch.float32)
    for mb in batches:
        if len(mb.logit_index):
            part = torch.empty(len(mb.logit_index), vocab, dtype=torch.float32)
            wait_polling(dist.broadcast(part, src=peers.logits_rank, group=peers.logits, async_op=True))
            logits[mb.logit_index] = part
    return logits
