"""One forward step as data, so that under tensor or pipeline parallelism rank 0 can hand it to every other rank.

Rank 0 schedules and samples; the other ranks hold their slices of the weights and KV cache and run exactly the
steps rank 0 runs (vLLM's driver / worker split). `TPDriver.send` broadcasts a step before rank 0 runs it, and
`receive_step` is where the other ranks wait for the next one (tally/engine/parallel/follower.py). Under pipeline
parallelism each stage runs its part of the step (tally/engine/parallel/pipeline.py).
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass

import torch
import torch.distributed as dist

from tally.attention.kv_cache import KVCache
from tally.attention.metadata import AttentionMetadata
from tally.errors import EngineDeadError
from tally.layers.spin_wait import wait_polling
from tally.models.decoder import CausalLM


@dataclass
class ModelStep:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    meta: AttentionMetadata
    logit_rows: torch.Tensor  # flat rows whose logits the step needs (prompt logprobs, then sampled positions)
    vocab_rows: int = 0  # > 0: only token ids below it are scored (a draft's reduced vocabulary); 0: all
    returns_hidden: bool = False  # pooling requests in the step: rank 0 reads the final hidden states too


def run_model_step(model: CausalLM, kv_caches: list[tuple[KVCache, KVCache]], step: ModelStep) -> torch.Tensor:
    """The forward pass, then float32 logits [len(logit_rows), V] (every rank gets them under tensor parallelism;
    only rank 0 samples)."""
    if step.returns_hidden:  # the same forward and collectives as rank 0's run_hidden_step
        return run_hidden_step(model, kv_caches, step)[0]
    return model.forward_logits(step.input_ids, step.positions, kv_caches, step.meta, step.logit_rows,
                                step.vocab_rows)


def run_hidden_step(model: CausalLM, kv_caches: list[tuple[KVCache, KVCache]],
                    step: ModelStep) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward pass, then the logits of `logit_rows` and every row's final hidden state [T, H]."""
    return model.forward_hidden(step.input_ids, step.positions, kv_caches, step.meta, step.logit_rows)


class TPDriver:
    """Rank 0's side of the step broadcast, over a process group of its own (`control`): the other ranks wait in
    it between requests, for as long as the server is idle, while the model's collectives keep a bounded timeout."""

    def __init__(self, control: dist.ProcessGroup, world_size: int) -> None:
        self.control = control
        self.world_size = world_size

    def send(self, step: ModelStep | None) -> None:
        """None tells the other ranks to stop."""
        payload = torch.frombuffer(bytearray(pickle.dumps(step)), dtype=torch.uint8)
        try:
            dist.broadcast(torch.tensor([len(payload)]), src=0, group=self.control)
            dist.broadcast(payload, src=0, group=self.control)
        except RuntimeError as exc:
            raise EngineDeadError(f"a parallel rank is gone ({exc}); the engine cannot run a step without every "
                                  "rank: restart the server") from exc


def receive_step(control: dist.ProcessGroup) -> ModelStep | None:
    """Polls for the next step a while before sleeping in the wait (tally/layers/spin_wait.py): under load the
    next step comes within milliseconds, and a rank woken from sleep would start it late."""
    size = torch.empty(1, dtype=torch.long)
    wait_polling(dist.broadcast(size, src=0, group=control, async_op=True))
    payload = torch.empty(int(size), dtype=torch.uint8)
    wait_polling(dist.broadcast(payload, src=0, group=control, async_op=True))
    return pickle.loads(payload.numpy().tobytes())
