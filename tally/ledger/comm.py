"""What tensor and pipeline parallel spend talking in one step: collectives × the link's latency + bytes ÷ its
bandwidth.

The counts are the engine's (tally/layers/parallel.py, tally/engine/parallel/pipeline.py). Tensor parallel all-reduces the
embedding (vocabulary-parallel) and, in every layer, the attention output and the MLP output, then all-gathers the
head's logits: 2 per layer + 2 collectives a step, whatever the batch, each a latency before it is bytes. A ring
all-reduce moves 2(p-1)/p of the tensor through each rank, an all-gather (p-1)/p of the result. Pipeline parallel
sends each micro-batch's hidden state across every stage boundary and the logit rows to rank 0, one after another.
Nothing overlaps the compute in the engine, so the estimate adds to the step's time.
"""
from __future__ import annotations

from dataclasses import dataclass

from tally.models.config import ModelConfig


@dataclass(frozen=True)
class Link:
    name: str
    latency_s: float  # one collective's or one send's fixed cost
    bandwidth_bytes_per_s: float  # per rank and direction
    measured: bool = False
    backend: str = "nccl"  # torch.distributed's: nccl keeps buffers of its own (tally/ledger/parallel.py)


# Datasheet figures for the links a GPU deployment uses; a CPU plan measures gloo on this machine instead
# (tally/ledger/link_probe.py). Latencies are NCCL's small-message all-reduce on those links, as published.
LINKS: dict[str, Link] = {
    "nvlink4": Link("nvlink4", 10e-6, 450e9),  # H100 SXM: 900 GB/s both directions
    "pcie4": Link("pcie4", 25e-6, 25e9),
    "ethernet-100g": Link("ethernet-100g", 50e-6, 12.5e9),
}


@dataclass(frozen=True)
class CommEstimate:
    link: str
    collectives: int  # TP collectives and PP sends on the step's critical path
    bytes_per_rank: float
    seconds: float


def step_comm(config: ModelConfig, *, tp: int, pp: int, tokens: int, logit_rows: int, activation_bytes: int,
              link: Link) -> CommEstimate:
    """One step of `tokens` tokens (a decode step: one per request) with `logit_rows` rows of logits."""
    calls, moved = 0, 0.0
    if tp > 1:
        hidden_bytes = tokens * config.hidden_size * activation_bytes
        reduces = 2 * config.num_layers + 1
        calls += reduces + 1
        moved += reduces * 2 * (tp - 1) / tp * hidden_bytes + (tp - 1) / tp * logit_rows * config.vocab_size * 4
    if pp > 1:
        micro_batches = min(pp, tokens)
        calls += micro_batches * (pp - 1) + micro_batches  # hidden states across boundaries, then logits
        moved += (pp - 1) * tokens * config.hidden_size * activation_bytes + logit_rows * config.vocab_size * 4
    seconds = calls * link.latency_s + moved / link.bandwidth_bytes_per_s if calls else 0.0
    return CommEstimate(link.name, calls, moved, seconds)


def find_link(name: str) -> Link:
    try:
        return LINKS[name]
    except KeyError:
        raise ValueError(f"unknown link {name!r}; use one of {', '.join(LINKS)} or measure (--link gloo)") from None
