"""The periodic line a server operator reads in the log, shaped like vLLM's (`--disable-log-stats` turns it off):

    Avg prompt throughput: 412.3 tokens/s, Avg generation throughput: 88.1 tokens/s, Running: 6 reqs,
    Waiting: 2 reqs, KV cache usage: 41.0%, Prefix cache hit rate: 12.5%
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

from tally.engine.snapshot import EngineSnapshot

log = logging.getLogger("tally.engine.stats")
INTERVAL_S = 10.0


class StatsLog:
    def __init__(self, interval_s: float = INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._last: tuple[float, EngineSnapshot] | None = None

    def maybe_log(self, snap: EngineSnapshot) -> str | None:
        """Logs (and returns) the line when `interval_s` has passed since the last one."""
        now = self._clock()
        if self._last is None:
            self._last = (now, snap)
            return None
        then, before = self._last
        elapsed = now - then
        if elapsed < self.interval_s:
            return None
        self._last = (now, snap)
        line = (f"Avg prompt throughput: {(snap.prompt_tokens - before.prompt_tokens) / elapsed:.1f} tokens/s, "
                f"Avg generation throughput: {(snap.generated_tokens - before.generated_tokens) / elapsed:.1f} "
                f"tokens/s, Running: {snap.num_running} reqs, Waiting: {snap.num_waiting} reqs, "
                f"KV cache usage: {snap.kv_usage:.1%}, Prefix cache hit rate: {snap.prefix_hit_rate:.1%}")
        if snap.speculation is not None:  # vLLM logs its SpecDecoding metrics line beside this one
            spec = snap.speculation
            line += (f", Speculative acceptance rate: {spec.acceptance_rate:.1%}, "
                     f"Accepted per position: {spec.accepted_per_position}")
        log.info(line)
        return line
