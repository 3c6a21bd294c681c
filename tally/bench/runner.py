"""Sending on schedule. Open loop: each request leaves at its scheduled time whatever the server
is doing (a slow server builds a queue, as real traffic does); if the client itself falls behind,
the lateness (sent - scheduled) is recorded per request. Closed loop: N workers, each sending its
next request as soon as the previous one ends.

Stopping early (Ctrl-C, `--time-limit`): no new request is sent; the requests in flight get
`grace_s` to finish (a second stop: none), then are cancelled and recorded with the cause
`cancelled`, which is not a failure. Every request that was sent ends in the records."""
from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from tally.bench.arrivals import WARMUP, Phase
from tally.bench.client import ClientConfig, RequestRecord, send
from tally.bench.feed import PromptFeed
from tally.bench.prompts import Prompt
from tally.bench.stats import CANCELLED
from tally.bench.wire import ConnectionPool
from tally.bench.workload import CLOSED_PHASE, PlannedRequest

INTERRUPTED = "interrupted"  # stop reasons, as the result's `stopped.reason` names them
TIME_LIMIT = "time_limit"
DEFAULT_GRACE_S = 5.0
T = TypeVar("T")


class StoppedBeforeSending(Exception):
    """A stop came while the prompts were still being prepared: nothing was measured."""


@dataclass
class RunState:
    """Live counters, read by the progress line and the soak sampler, and the run's stop."""

    t0: float = field(default_factory=time.perf_counter)
    expected: int | None = None  # requests in the schedule (open loop)
    end_s: float | None = None  # planned end of sending
    records: list[RequestRecord] = field(default_factory=list)  # in send order
    done: int = 0
    failed: int = 0
    cancelled: int = 0
    sending: bool = False  # the clock started: requests may be in flight
    time_limit_s: float | None = None  # stop at this run time (from the start of sending)
    grace_s: float = DEFAULT_GRACE_S  # how long requests in flight may finish after a stop
    stop_reason: str | None = None  # INTERRUPTED or TIME_LIMIT once the run was told to stop
    stop_detail: str | None = None  # the same, for a person
    stopped_s: float | None = None  # run time of the stop
    stopping: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    hurry: asyncio.Event = field(default_factory=asyncio.Event, repr=False)  # cancel now
    on_stop: Callable[[RunState], None] | None = field(default=None, repr=False)  # e.g. say so

    def now_s(self) -> float:
        return time.perf_counter() - self.t0

    @property
    def in_flight(self) -> int:
        return len(self.records) - self.done

    def request_stop(self, reason: str, detail: str) -> bool:
        """The first call stops sending and starts the grace period; any later call cancels the
        requests still in flight at once. Returns whether this call was the first."""
        if self.stop_reason is not None:
            self.hurry.set()
            return False
        self.stop_reason, self.stop_detail, self.stopped_s = reason, detail, self.now_s()
        self.stopping.set()
        if self.on_stop is not None:
            self.on_stop(self)
        return True


async def until_stopped(state: RunState, work: Awaitable[T]) -> T:
    """`work`'s result, unless a stop comes first (then StoppedBeforeSending)."""
    task = asyncio.ensure_future(work)
    stop = asyncio.create_task(state.stopping.wait())
    try:
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
    if task.cancelled():
        raise StoppedBeforeSending(state.stop_detail or "stopped")
    return task.result()


async def _send_tracked(state: RunState, pool: ConnectionPool, config: ClientConfig,
                        record: RequestRecord, prompt: Prompt) -> RequestRecord:
    state.records.append(record)
    try:
        await send(pool, config, record, prompt, state.t0)
    except asyncio.CancelledError:  # the run stopped with this request in flight
        record.error = CANCELLED
        record.detail = f"in flight when the run stopped ({state.stop_detail or 'cancelled'})"
        record.end_s = state.now_s()
        raise
    finally:
        state.done += 1
        if record.error == CANCELLED:
            state.cancelled += 1
        else:
            state.failed += record.error is not None
    return record


def _record(request: PlannedRequest, prompt: Prompt, scheduled_s: float, phase: str) -> RequestRecord:
    return RequestRecord(id=request.id, phase=phase, scheduled_s=scheduled_s,
                         prompt_tokens=prompt.tokens, expected_prompt_tokens=prompt.tokens,
                         expected_output_tokens=request.output_tokens,
                         warmup=phase == WARMUP)


async def _time_limit(state: RunState) -> None:
    await asyncio.sleep(max(state.time_limit_s - state.now_s(), 0.0))
    state.request_stop(TIME_LIMIT, f"--time-limit {state.time_limit_s:g}s reached")


async def _drive(state: RunState, sender: asyncio.Task | None,
                 work: Callable[[], list[asyncio.Task]]) -> None:
    """Waits for `sender` (which starts the requests), then for every task `work()` returns. On a
    stop the sender is cancelled at once; the work gets `state.grace_s` (none after a second
    stop), then what is left is cancelled. Other errors of the tasks propagate."""
    stop = asyncio.create_task(state.stopping.wait())
    limit = asyncio.create_task(_time_limit(state)) if state.time_limit_s is not None else None
    everything: asyncio.Future | None = None
    try:
        if sender is not None:
            await asyncio.wait({sender, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not sender.done():
                sender.cancel()
                await asyncio.wait({sender})
            if not sender.cancelled():
                sender.result()  # e.g. a prompt that could not be built
        everything = asyncio.gather(*work(), return_exceptions=True)
        await asyncio.wait({everything, stop}, return_when=asyncio.FIRST_COMPLETED)
        if not everything.done():  # stopped with requests in flight: a grace period
            hurry = asyncio.create_task(state.hurry.wait())
            await asyncio.wait({everything, hurry}, timeout=state.grace_s,
                               return_when=asyncio.FIRST_COMPLETED)
            hurry.cancel()
    finally:
        for task in (stop, limit):
            if task is not None:
                task.cancel()
        if everything is None:  # the sender failed or we were cancelled: stop what it started
            everything = asyncio.gather(*work(), return_exceptions=True)
        if not everything.done():
            for task in work():
                task.cancel()  # each records itself as cancelled; the gather then completes
            await asyncio.wait({everything})
    for task in work():
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()


async def run_open_loop(state: RunState, pool: ConnectionPool, config: ClientConfig,
                        requests: list[PlannedRequest], feed: PromptFeed,
                        max_in_flight: int | None = None) -> list[RequestRecord]:
    """The records of the requests sent, in schedule order: all of them unless the run stopped. With
    `max_in_flight`, a request due while that many are in flight waits for one to end; latencies count from its
    send as always, and the wait shows as its lateness (sent − scheduled), the client's and not the server's."""
    slots = asyncio.Semaphore(max_in_flight) if max_in_flight else None
    state.expected = len(requests)
    state.end_s = requests[-1].scheduled_s if requests else 0.0
    state.t0, state.sending = time.perf_counter(), True
    tasks: list[asyncio.Task] = []

    async def dispatch() -> None:
        for request in requests:
            prompt = await feed.get(request.id)  # normally built long ago; waiting shows as lateness
            wait_s = request.scheduled_s - (time.perf_counter() - state.t0)
            # sleep(0) when behind still lets started requests read their streams
            await asyncio.sleep(max(wait_s, 0.0))
            if slots is None:
                record = _record(request, prompt, request.scheduled_s, request.phase)
                tasks.append(asyncio.create_task(_send_tracked(state, pool, config, record, prompt)))
                continue
            await slots.acquire()
            record = _record(request, prompt, request.scheduled_s, request.phase)
            tasks.append(asyncio.create_task(_send_in_slot(state, pool, config, record, prompt, slots)))

    await _drive(state, asyncio.create_task(dispatch()), lambda: tasks)
    return list(state.records)


async def _send_in_slot(state: RunState, pool: ConnectionPool, config: ClientConfig, record: RequestRecord,
                        prompt: Prompt, slots: asyncio.Semaphore) -> RequestRecord:
    try:
        return await _send_tracked(state, pool, config, record, prompt)
    finally:
        slots.release()


async def run_closed_loop(state: RunState, pool: ConnectionPool, config: ClientConfig,
                          concurrency: int, plan: Callable[[int], PlannedRequest],
                          feed: PromptFeed, warmup_s: float, duration_s: float | None,
                          max_requests: int | None) -> tuple[list[RequestRecord], list[Phase]]:
    """Workers stop taking new requests after warmup + duration, or after `max_requests`
    measured requests were started, or on a stop; requests in flight are finished (after a
    stop: within the grace period)."""
    stop_s = None if duration_s is None else warmup_s + duration_s
    state.end_s = stop_s
    ids = itertools.count()
    measured_started = 0
    state.t0, state.sending = time.perf_counter(), True

    async def worker() -> None:
        nonlocal measured_started
        while state.stop_reason is None:
            if stop_s is not None and state.now_s() >= stop_s:
                return
            if max_requests is not None and measured_started >= max_requests:
                return
            request = plan(next(ids))
            phase = WARMUP if state.now_s() < warmup_s else CLOSED_PHASE
            measured_started += phase != WARMUP
            prompt = await feed.get(request.id)
            if state.stop_reason is not None:
                return
            record = _record(request, prompt, state.now_s(), phase)
            await _send_tracked(state, pool, config, record, prompt)

    workers = [asyncio.create_task(worker()) for _ in range(concurrency)]
    await _drive(state, None, lambda: workers)
    end_s = max((r.end_s for r in state.records if r.end_s is not None), default=0.0)
    phases = ([Phase(WARMUP, None, 0.0, warmup_s)] if warmup_s > 0 else []) + [
        Phase(CLOSED_PHASE, None, warmup_s, stop_s if stop_s is not None else end_s)]
    return sorted(state.records, key=lambda r: r.id), phases
