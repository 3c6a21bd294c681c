"""The engine's counters at one moment, for /metrics, /ledger and benchmarks: read between steps, never mid-step."""
from __future__ import annotations

from dataclasses import dataclass

from tally.engine.speculation_stats import SpeculationStats


@dataclass(frozen=True)
class EngineSnapshot:
    num_running: int = 0
    num_waiting: int = 0
    num_blocks: int = 0
    num_free_blocks: int = 0
    num_cached_free_blocks: int = 0
    num_used_blocks: int = 0
    num_unfilled_slots: int = 0
    block_size_tokens: int = 0
    prefix_queried_tokens: int = 0
    prefix_hit_tokens: int = 0
    num_preemptions: int = 0
    num_steps: int = 0
    num_started: int = 0  # engine requests admitted to the batch so far
    prompt_tokens: int = 0  # prompt tokens computed so far (prefix-cache hits not counted)
    generated_tokens: int = 0
    speculation: SpeculationStats | None = None  # a copy; None when speculative decoding is off

    @property
    def kv_usage(self) -> float:
        return self.num_used_blocks / self.num_blocks if self.num_blocks else 0.0

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hit_tokens / self.prefix_queried_tokens if self.prefix_queried_tokens else 0.0
