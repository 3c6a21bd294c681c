"""What to send: each request's lengths, corpus offset and shared-prefix flag, drawn from the
seed in blocks (request i is the same whatever the arrival process or run length), plus the
open-loop schedule of when to send it."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tally.bench.arrivals import (
    WARMUP,
    Phase,
    RateArrivals,
    ReplayArrivals,
    build_schedule,
)
from tally.bench.length_samplers import LengthSampler
from tally.errors import ConfigError
from tally.traces import Trace

_BLOCK = 256
CLOSED_PHASE = "closed"


@dataclass(frozen=True)
class WorkloadConfig:
    lengths: LengthSampler | None  # None: replay the trace's own lengths with its timestamps
    arrivals: RateArrivals | ReplayArrivals | None  # None: closed loop at `concurrency`
    concurrency: int | None = None
    duration_s: float | None = None
    max_requests: int | None = None  # measured requests (warmup comes on top)
    warmup_s: float = 0.0
    seed: int = 0
    system_prompt_tokens: int = 0
    prefix_share: float = 0.0  # fraction of requests that start with the shared system prompt
    replay_trace: Trace | None = None
    max_model_len: int | None = None  # from the server; longer requests are clipped to fit

    def __post_init__(self) -> None:
        phased = isinstance(self.arrivals, RateArrivals) and bool(self.arrivals.phases)
        if phased and (self.duration_s is not None or self.max_requests is not None):
            raise ConfigError("--phases sets the run length itself; drop --duration/--requests")
        if self.arrivals is None and (self.concurrency or 0) < 1:
            raise ConfigError("a closed loop needs --concurrency >= 1")
        if self.concurrency is not None and self.concurrency < 1:
            raise ConfigError("--concurrency must be >= 1")
        if not (phased or isinstance(self.arrivals, ReplayArrivals)) and (
                self.duration_s is None and self.max_requests is None):
            raise ConfigError("give --duration or --requests to bound the run")
        if self.lengths is None and self.replay_trace is None:
            raise ConfigError("lengths come from --lengths, or from the trace given to --replay")
        if not 0.0 <= self.prefix_share <= 1.0:
            raise ConfigError("--prefix-share is a fraction between 0 and 1")
        if self.system_prompt_tokens < 0 or self.warmup_s < 0:
            raise ConfigError("--system-prompt-tokens and --warmup cannot be negative")

    def describe(self) -> dict:
        lengths = self.lengths.describe() if self.lengths else {
            "kind": "replay", "source": self.replay_trace.source if self.replay_trace else None}
        arrivals = {**self.arrivals.describe(), "max_concurrency": self.concurrency} if self.arrivals else {
            "kind": "closed_loop", "concurrency": self.concurrency}
        return {"lengths": lengths, "arrivals": arrivals, "duration_s": self.duration_s,
                "max_requests": self.max_requests, "warmup_s": self.warmup_s, "seed": self.seed,
                "system_prompt_tokens": self.system_prompt_tokens,
                "prefix_share": self.prefix_share, "max_model_len": self.max_model_len}


@dataclass(frozen=True)
class PlannedRequest:
    id: int
    phase: str
    scheduled_s: float  # open loop: send time; closed loop: 0 until a worker takes it
    prompt_tokens: int  # without the shared system prompt
    output_tokens: int
    corpus_start: int  # where its prompt text begins in the corpus (in tokens)
    shared_prefix: bool

    @property
    def warmup(self) -> bool:
        return self.phase == WARMUP


class RequestPlanner:
    def __init__(self, config: WorkloadConfig):
        self.config = config
        self._blocks: dict[int, tuple[np.ndarray, ...]] = {}

    def _block(self, index: int) -> tuple[np.ndarray, ...]:
        if index not in self._blocks:
            cfg = self.config
            rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, 2, index]))
            prompt, output = (cfg.lengths.sample(rng, _BLOCK) if cfg.lengths else
                              (np.zeros(_BLOCK, np.int64), np.zeros(_BLOCK, np.int64)))
            starts = rng.integers(0, 2**31 - 1, _BLOCK)
            shared = rng.random(_BLOCK) < cfg.prefix_share
            self._blocks[index] = (prompt, output, starts, shared)
        return self._blocks[index]

    def request(self, i: int, phase: str, scheduled_s: float = 0.0,
                trace_row: int | None = None) -> PlannedRequest:
        prompt, output, starts, shared = (a[i % _BLOCK] for a in self._block(i // _BLOCK))
        trace = self.config.replay_trace
        if trace_row is not None and self.config.lengths is None and trace is not None:
            prompt = max(int(trace.prompt_tokens[trace_row]), 1)
            output = max(int(trace.output_tokens[trace_row]), 1)
        prompt, output = self._fit(int(prompt), int(output), bool(shared))
        return PlannedRequest(i, phase, scheduled_s, prompt, output, int(starts), bool(shared))

    def _fit(self, prompt: int, output: int, shared: bool) -> tuple[int, int]:
        """Clips a request to the server's context window (prompt first, keeping the output)."""
        limit = self.config.max_model_len
        if limit is None:
            return prompt, output
        system = self.config.system_prompt_tokens if shared else 0
        output = min(output, max(limit // 2, 1))
        return max(min(prompt, limit - output - system), 1), output

    def open_loop(self) -> tuple[list[PlannedRequest], list[Phase]]:
        cfg = self.config
        assert cfg.arrivals is not None
        schedule = build_schedule(cfg.arrivals, cfg.seed, cfg.warmup_s, cfg.duration_s,
                                  cfg.max_requests)
        rows = schedule.trace_rows
        requests = [self.request(i, schedule.phase[i], float(t),
                                 None if rows is None else int(rows[i]))
                    for i, t in enumerate(schedule.scheduled_s)]
        return requests, schedule.phases
