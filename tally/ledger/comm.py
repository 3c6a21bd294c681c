"""What tensor and pipeline parallel spend talking in one step: collectives × the link's latency + bytes ÷ its
bandwidth.

The counts are the engine's (tally/layers/parallel.py, tally/engine/parallel/pipeline.py). Tensor parallel
all-reduces the embedding (vocabulary-parallel), all-gathers in every layer the attention output and o_proj's, and
in a dense MLP its columns and down_proj's, then all-gathers the head's logits: 4 per layer + 2 collectives a step
(2 in a layer of experts, held whole), whatever the batch, each a latency before it is bytes. With partial sums
(batch_invariant off) a layer all-reduces the attention and the MLP output instead: 2 per layer + 2. A ring
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
              link: Link, partial_sums: bool = False) -> CommEstimate:
    """One step of `tokens` tokens (a decode step: one per request) with `logit_rows` rows of logits."""
    calls, moved = 0, 0.0
    if tp > 1:
        hidden_bytes = tokens * config.hidden_size * activation_bytes
        share = (tp - 1) / tp
        if partial_sums:
            reduces, gathered = 2 * config.num_layers + 1, 0
        else:
            dense = sum(not config.is_moe_layer(i) for i in range(config.num_layers))
            reduces = 1
            gathered = (config.num_layers * (config.q_size + config.hidden_size)
                        + dense * (config.intermediate_size + config.hidden_size)) * tokens * activation_bytes
            calls += 2 * config.num_layers + 2 * dense
        calls += reduces + 1
        moved += reduces * 2 * share * hidden_bytes + share * (gathered + logit_rows * config.vocab_size * 4)
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
