"""One benchmark run, start to end: probe the server, build the workload and its prompts, send
it (with the live line and, in soak mode, the sampler beside it), and assemble the result."""
from __future__ import annotations

import asyncio
import contextlib
import itertools
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
from tally.bench.runner import RunState, run_closed_loop, run_open_loop
from tally.bench.scrape import scrape
from tally.bench.server_info import probe_server
from tally.bench.soak import sample_loop
from tally.bench.stats import Slo
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
        await feed.start(ready)
        if requests is None:
            return await run_closed_loop(state, pool, client, wl.concurrency,
                                         lambda i: planner.request(i, ""), feed, wl.warmup_s,
                                         wl.duration_s, wl.max_requests)
        return await run_open_loop(state, pool, client, requests, feed), phases
    finally:
        await feed.close()


async def _stop(tasks: list[asyncio.Task]) -> None:
    for task in tasks:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


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
            state, samples = RunState(), []
            before = await scrape(http, cfg.url)
            side = [asyncio.create_task(show_progress(state))] if cfg.progress else []
            if cfg.sample_s:
                side.append(asyncio.create_task(sample_loop(state, http, cfg.url, cfg.sample_s,
                                                            cfg.server_pid, samples)))
            started_at = time.time()
            try:
                records, phases = await _send(cfg, state, pool, client, planner, builder)
            finally:
                await _stop(side)
            after = await scrape(http, cfg.url)
        finally:
            pool.close()
    outcome = RunOutcome(command or sys.argv, started_at, info, tokenizer, builder,
                         planner.config, records, phases, before, after,
                         samples if cfg.sample_s else None)
    return build_result(outcome, cfg.slo, cfg.timeout_s)
