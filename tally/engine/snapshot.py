"""The engine's counters at one moment, for /metrics, /ledger and benchmarks: read between steps, never mid-step."""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from tally.engine.kv_tiers.stats import DiskCacheStats, SwapStats
from tally.engine.speculation.policy import Counters
from tally.engine.speculation.stats import SpeculationStats

ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)  # vLLM's


@dataclass(frozen=True)
class IterationTokens:
    """How many tokens each engine step computed (prompt + generated), counted in vLLM's buckets of
    vllm:iteration_tokens_total. Immutable: observing returns the next value, which a snapshot holds as it is."""

    counts: tuple[int, ...] = (0,) * (len(ITERATION_TOKEN_BUCKETS) + 1)  # per bucket, not cumulative; last: above all
    total_tokens: int = 0

    def observe(self, tokens: int) -> IterationTokens:
        at = bisect_left(ITERATION_TOKEN_BUCKETS, tokens)
        return IterationTokens(self.counts[:at] + (self.counts[at] + 1,) + self.counts[at + 1:],
                               self.total_tokens + tokens)


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
    decode_step_seconds: float = 0.0  # time in steps without a prompt chunk, and the tokens they generated
    decode_step_tokens: int = 0
    speculation: SpeculationStats | None = None  # a copy; None when speculative decoding is off
    speculation_policy: Counters | None = None  # a copy of the adaptive policy's; None without one
    iteration_tokens: IterationTokens | None = None  # None: the engine does not count its steps' tokens
    swap: SwapStats | None = None  # a copy; None without a swap space
    disk_cache: DiskCacheStats | None = None  # a copy; None without a disk prefix tier

    @property
    def kv_usage(self) -> float:
        return self.num_used_blocks / self.num_blocks if self.num_blocks else 0.0

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hit_tokens / self.prefix_queried_tokens if self.prefix_queried_tokens else 0.0
