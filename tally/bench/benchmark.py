"""One benchmark run, start to end: probe the server, build the workload and its prompts, send
it (with the live line and, in soak mode, the sampler beside it), and assemble the result. A run
stopped early (Ctrl-C, `--time-limit`) still assembles the result of what finished, marked partial."""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import httpx

from tally.bench.arrivals import Phase
from tally.bench.client import ClientConfig, RequestRecord
from tally.bench.feed import AHEAD, PromptFeed
from tally.bench.progress import show_progress
from tally.bench.prompts import PromptBuilder
from tally.bench.report_json import RunOutcome, build_result
from tally.bench.runner import (
    DEFAULT_GRACE_S,
    INTERRUPTED,
    RunState,
    run_closed_loop,
    run_open_loop,
    until_stopped,
)
from tally.bench.scrape import scrape
from tally.bench.server_info import probe_server
from tally.bench.soak import sample_loop
from tally.bench.stats import CANCELLED, Slo
from tally.bench.tokenizer import (
    ApproxTokenizer,
    LocalTokenizer,
    Tokenizer,
    server_tokenizer,
)
from tally.bench.wire import ConnectionPool
from tally.bench.workload import RequestPlanner, WorkloadConfig


@dataclass(frozen=True)
class BenchConfig:
    url: str
    workload: WorkloadConfig
    model: str | None = None
    endpoint: str = "completions"
    slo: Slo | None = None
    timeout_s: float = 300.0
    tokenizer_path: Path | None = None
    api_key: str | None = None
    extra_body: tuple[tuple[str, object], ...] = ()
    sample_s: float | None = None  # sample /metrics and RSS this often (soak mode)
    server_pid: int | None = None
    progress: bool = True
    time_limit_s: float | None = None  # stop sending at this run time and report what finished
    grace_s: float = DEFAULT_GRACE_S  # after a stop, how long requests in flight may finish
    stop_on_sigint: bool = False  # while sending, Ctrl-C stops the run instead of killing it


# After an early stop the server may be stuck; its /metrics gets this long, not httpx's 60 s.
SCRAPE_AFTER_STOP_S = 5.0


async def _tokenizer(cfg: BenchConfig, pool: ConnectionPool, model: str) -> Tokenizer:
    if cfg.tokenizer_path is not None:
        return LocalTokenizer(cfg.tokenizer_path)
    return await server_tokenizer(pool, model) or ApproxTokenizer()


def _status(message: str, cfg: BenchConfig) -> None:
    if cfg.progress:
        print(message, file=sys.stderr, flush=True)


async def _send(cfg: BenchConfig, state: RunState, pool: ConnectionPool, client: ClientConfig,
                planner: RequestPlanner,
                builder: PromptBuilder) -> tuple[list[RequestRecord], list[Phase]]:
    wl = planner.config
    if wl.arrivals is None:
        requests = None
        # A run bounded by --requests (no warmup) needs no more prompts than it can send: an unbounded
        # feed kept calling the server's /tokenize during the measured run and slowed it down.
        bounded = wl.max_requests is not None and not wl.warmup_s
        ids = range(wl.max_requests + wl.concurrency) if bounded else itertools.count()
        feed = PromptFeed(builder, (planner.request(i, "") for i in ids))
        ready = (wl.max_requests + wl.concurrency) if wl.max_requests is not None else AHEAD
    else:
        requests, phases = planner.open_loop()
        feed = PromptFeed(builder, requests)
        ready = len(requests)
    ready = min(ready, AHEAD)
    _status(f"preparing {ready} prompts ({builder.tokenizer.source})", cfg)
    try:
        await until_stopped(state, feed.start(ready))
        if requests is None:
            return await run_closed_loop(state, pool, client, wl.concurrency,
                                         lambda i: planner.request(i, ""), feed, wl.warmup_s,
                                         wl.duration_s, wl.max_requests)
        return await run_open_loop(state, pool, client, requests, feed, wl.concurrency), phases
    finally:
        await feed.close()


async def _stop(tasks: list[asyncio.Task]) -> None:
    for task in tasks:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _on_sigint(state: RunState) -> None:
    in_flight = state.in_flight
    if not state.request_stop(INTERRUPTED, "interrupted (Ctrl-C)") and in_flight:
        print(f"tally bench: cancelling the {in_flight} requests still in flight", file=sys.stderr,
              flush=True)


@contextlib.contextmanager
def _sigint_stops(state: RunState, enabled: bool):
    """While it is in effect, SIGINT stops the run (a second one cancels the requests in flight)
    instead of raising KeyboardInterrupt; elsewhere (and off the main thread) Ctrl-C works as usual."""
    loop, previous = asyncio.get_running_loop(), signal.getsignal(signal.SIGINT)
    if enabled:
        try:
            loop.add_signal_handler(signal.SIGINT, _on_sigint, state)
        except (NotImplementedError, RuntimeError, ValueError):  # Windows, or not the main thread
            enabled = False
    try:
        yield
    finally:
        if enabled:
            loop.remove_signal_handler(signal.SIGINT)
            if previous is not None:  # asyncio.run's own handler, which remove_signal_handler drops
                signal.signal(signal.SIGINT, previous)


def _announce_stop(state: RunState) -> None:
    if not state.sending:
        print(f"tally bench: {state.stop_detail} while preparing prompts", file=sys.stderr, flush=True)
        return
    in_flight = state.in_flight
    wait = (f"; waiting up to {state.grace_s:g}s for the {in_flight} requests in flight"
            f"{' (Ctrl-C again to cancel them now)' if state.stop_reason == INTERRUPTED else ''}"
            if in_flight and state.grace_s > 0 else "")
    print(f"tally bench: {state.stop_detail} at {state.stopped_s:.1f}s: no new requests{wait}",
          file=sys.stderr, flush=True)


def _stopped(state: RunState, records: list[RequestRecord]) -> dict | None:
    """What a stop left behind: requests sent, finished and cancelled (and never sent, when the
    schedule was known), or None for a run that went to its end."""
    cancelled = sum(r.error == CANCELLED for r in records)
    if state.stop_reason is None or (state.expected == len(records) and not cancelled):
        return None  # not stopped, or stopped when every scheduled request had finished anyway
    return {"reason": state.stop_reason, "detail": state.stop_detail,
            "at_s": round(state.stopped_s, 6), "time_limit_s": state.time_limit_s,
            "grace_s": state.grace_s, "scheduled": state.expected, "sent": len(records),
            "finished": len(records) - cancelled, "cancelled": cancelled,
            "not_sent": None if state.expected is None else state.expected - len(records)}


def _cut_phases(phases: list[Phase], records: list[RequestRecord], stop_s: float) -> list[Phase]:
    """The phases of a run that stopped at `stop_s`: those that had begun, the last one ending
    there (what finished after the stop falls in the drain row)."""
    used = {r.phase for r in records}
    return [replace(p, end_s=min(p.end_s, max(stop_s, p.start_s))) for p in phases
            if p.start_s < stop_s or p.name in used]


async def run_benchmark(cfg: BenchConfig, command: list[str] | None = None) -> dict:
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    pool = ConnectionPool(cfg.url, headers)
    async with httpx.AsyncClient(timeout=60.0, headers=headers) as http:
        try:
            info = await probe_server(http, cfg.url, cfg.endpoint, cfg.model)
            tokenizer = await _tokenizer(cfg, pool, info.model)
            builder = await PromptBuilder.create(tokenizer)
            await builder.set_system_prompt(cfg.workload.system_prompt_tokens)
            planner = RequestPlanner(replace(cfg.workload, max_model_len=info.max_model_len))
            client = ClientConfig(info.model, cfg.endpoint, cfg.timeout_s, info.ignore_eos,
                                  cfg.extra_body)
            state = RunState(time_limit_s=cfg.time_limit_s, grace_s=cfg.grace_s,
                             on_stop=_announce_stop)
            samples: list = []
            before = await scrape(http, cfg.url)
            side = [asyncio.create_task(show_progress(state))] if cfg.progress else []
            if cfg.sample_s:
                side.append(asyncio.create_task(sample_loop(state, http, cfg.url, cfg.sample_s,
                                                            cfg.server_pid, samples)))
            started_at = time.time()
            with _sigint_stops(state, cfg.stop_on_sigint):
                try:
                    records, phases = await _send(cfg, state, pool, client, planner, builder)
                    stopped = _stopped(state, records)  # a later stop found the run done
                finally:
                    await _stop(side)
                if stopped is None:
                    after = await scrape(http, cfg.url)
                else:
                    phases = _cut_phases(phases, records, state.stopped_s)
                    try:
                        after = await asyncio.wait_for(scrape(http, cfg.url), SCRAPE_AFTER_STOP_S)
                    except TimeoutError:
                        after = None
        finally:
            pool.close()
    outcome = RunOutcome(command or sys.argv, started_at, info, tokenizer, builder,
                         planner.config, records, phases, before, after,
                         samples if cfg.sample_s else None, stopped, state.t0)
    return build_result(outcome, cfg.slo, cfg.timeout_s)
