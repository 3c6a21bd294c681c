"""The roofline: how fast decode and prefill can possibly go on a device, from bytes and FLOPs.

Decode step: every step reads all weights once plus each running request's KV cache, and computes
2 FLOPs per matmul parameter per request plus attention. Time = max(bytes / bandwidth, FLOPs / peak), plus the
collectives' time when the model is split over devices.
Prefill: 2 x matmul params x prompt tokens plus causal attention 2 x layers x (heads x head dim) x
tokens^2, at peak FLOP/s (but never faster than reading the weights once). Both are lower bounds:
real engines reach 60-90% of bandwidth in decode and 40-70% of peak in prefill.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelCost:
    weight_bytes: int  # read once per step (per device)
    matmul_params: int  # 2 FLOPs each per token
    attention_width: int  # layers x query heads x head dim: attention FLOPs scale with it
    kv_bytes_per_token: int

    def attention_flops(self, query_tokens: int, context_tokens: int, causal: bool) -> float:
        """QK^T and AV: 4 FLOPs per (query, key, channel); causal prefill sees half the square."""
        pairs = query_tokens * context_tokens / 2 if causal else query_tokens * context_tokens
        return 4 * self.attention_width * pairs


@dataclass(frozen=True)
class DecodeEstimate:
    concurrency: int
    context_tokens: int
    bytes_per_step: float
    memory_s: float  # bytes / bandwidth
    compute_s: float  # FLOPs / peak
    comm_s: float  # tensor / pipeline parallel collectives (tally/ledger/comm.py): they do not overlap compute
    step_s: float  # the larger of memory and compute (the roofline), plus communication
    tokens_per_s: float  # all requests together
    bound: str  # "memory", "compute" or "communication"

    @property
    def ms_per_token(self) -> float:
        """What each request sees between tokens (TPOT lower bound)."""
        return self.step_s * 1e3


def decode_step(cost: ModelCost, *, concurrency: int, context_tokens: int,
                bandwidth_bytes_per_s: float, flops_per_s: float, comm_s: float = 0.0) -> DecodeEstimate:
    kv_bytes = concurrency * context_tokens * cost.kv_bytes_per_token
    bytes_per_step = cost.weight_bytes + kv_bytes
    flops = concurrency * (2 * cost.matmul_params + cost.attention_flops(1, context_tokens, causal=False))
    memory_s, compute_s = bytes_per_step / bandwidth_bytes_per_s, flops / flops_per_s
    step_s = max(memory_s, compute_s) + comm_s
    bound = "communication" if comm_s > max(memory_s, compute_s) else "memory" if memory_s >= compute_s else "compute"
    return DecodeEstimate(concurrency, context_tokens, bytes_per_step, memory_s, compute_s, comm_s, step_s,
                          concurrency / step_s, bound)


def prefill_seconds(cost: ModelCost, *, prompt_tokens: int, bandwidth_bytes_per_s: float,
                    flops_per_s: float) -> float:
    """Time to first token for one prompt on an idle device (no queueing)."""
    flops = 2 * cost.matmul_params * prompt_tokens + cost.attention_flops(prompt_tokens, prompt_tokens, causal=True)
    return max(flops / flops_per_s, cost.weight_bytes / bandwidth_bytes_per_s)
