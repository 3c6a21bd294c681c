"""Sending on schedule. Open loop: each request leaves at its scheduled time whatever the server
is doing (a slow server builds a queue, as real traffic does); if the client itself falls behind,
the lateness (sent - scheduled) is recorded per request. Closed loop: N workers, each sending its
next request as soon as the previous one ends."""
from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tally.bench.arrivals import WARMUP, Phase
from tally.bench.client import ClientConfig, RequestRecord, send
from tally.bench.feed import PromptFeed
from tally.bench.prompts import Prompt
from tally.bench.wire import ConnectionPool
from tally.bench.workload import CLOSED_PHASE, PlannedRequest


@dataclass
class RunState:
    """Live counters, read by the progress line and the soak sampler."""

    t0: float = field(default_factory=time.perf_counter)
    expected: int | None = None  # requests in the schedule (open loop)
    end_s: float | None = None  # planned end of sending
    records: list[RequestRecord] = field(default_factory=list)  # in send order
    done: int = 0
    failed: int = 0

    def now_s(self) -> float:
        return time.perf_counter() - self.t0

    @property
    def in_flight(self) -> int:
        return len(self.records) - self.done


async def _send_tracked(state: RunState, pool: ConnectionPool, config: ClientConfig,
                        record: RequestRecord, prompt: Prompt) -> RequestRecord:
    state.records.append(record)
    try:
        await send(pool, config, record, prompt, state.t0)
    finally:
        state.done += 1
        state.failed += record.error is not None
    return record


def _record(request: PlannedRequest, prompt: Prompt, scheduled_s: float, phase: str) -> RequestRecord:
    return RequestRecord(id=request.id, phase=phase, scheduled_s=scheduled_s,
                         prompt_tokens=prompt.tokens, expected_prompt_tokens=prompt.tokens,
                         expected_output_tokens=request.output_tokens,
                         warmup=phase == WARMUP)


async def run_open_loop(state: RunState, pool: ConnectionPool, config: ClientConfig,
                        requests: list[PlannedRequest], feed: PromptFeed) -> list[RequestRecord]:
    state.expected = len(requests)
    state.end_s = requests[-1].scheduled_s if requests else 0.0
    state.t0 = time.perf_counter()
    tasks = []
    for request in requests:
        prompt = await feed.get(request.id)  # normally built long ago; waiting shows as lateness
        wait_s = request.scheduled_s - (time.perf_counter() - state.t0)
        # sleep(0) when behind still lets started requests read their streams
        await asyncio.sleep(max(wait_s, 0.0))
        record = _record(request, prompt, request.scheduled_s, request.phase)
        tasks.append(asyncio.create_task(_send_tracked(state, pool, config, record, prompt)))
    return list(await asyncio.gather(*tasks))


async def run_closed_loop(state: RunState, pool: ConnectionPool, config: ClientConfig,
                          concurrency: int, plan: Callable[[int], PlannedRequest],
                          feed: PromptFeed, warmup_s: float, duration_s: float | None,
                          max_requests: int | None) -> tuple[list[RequestRecord], list[Phase]]:
    """Workers stop taking new requests after warmup + duration, or after `max_requests`
    measured requests were started; requests in flight are always finished."""
    stop_s = None if duration_s is None else warmup_s + duration_s
    state.end_s = stop_s
    ids = itertools.count()
    measured_started = 0
    state.t0 = time.perf_counter()

    async def worker() -> None:
        nonlocal measured_started
        while True:
            if stop_s is not None and state.now_s() >= stop_s:
                return
            if max_requests is not None and measured_started >= max_requests:
                return
            request = plan(next(ids))
            phase = WARMUP if state.now_s() < warmup_s else CLOSED_PHASE
            measured_started += phase != WARMUP
            prompt = await feed.get(request.id)
            record = _record(request, prompt, state.now_s(), phase)
            await _send_tracked(state, pool, config, record, prompt)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    end_s = max((r.end_s for r in state.records if r.end_s is not None), default=0.0)
    phases = ([Phase(WARMUP, None, 0.0, warmup_s)] if warmup_s > 0 else []) + [
        Phase(CLOSED_PHASE, None, warmup_s, stop_s if stop_s is not None else end_s)]
    return sorted(state.records, key=lambda r: r.id), phases
