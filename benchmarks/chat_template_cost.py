"""What rendering chat templates in a worker process adds to a chat request on the built-in model: `render_chat`
(template and tokenizing) in this process against the same through tally/models/template_workers.py from a thread,
as the server calls it, and a whole chat request through `tally serve` (max_tokens 1) for scale.

    python benchmarks/chat_template_cost.py [--renders 2000] [--requests 50]

Medians of --renders renderings and of --requests chat requests.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

import httpx
import tally  # noqa: F401  first: it sets OpenMP's waiting policy before torch loads libgomp

from tally.models.chat_template import refuse_without_template, render_chat
from tally.models.loader import load_checkpoint
from tally.models.registry import resolve_model
from tally.models.template_workers import TemplateWorkers
from tally.models.tokenizer import load_tokenizer
from tally.server.process import ServerProcess

MESSAGES = [{"role": "system", "content": "You are a concise assistant."},
            {"role": "user", "content": "What is the capital of France? Answer in one word."}]


def median_us(calls: int, call) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


async def median_us_in_thread(calls: int, call) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        await asyncio.to_thread(call)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--renders", type=int, default=2000)
    p.add_argument("--requests", type=int, default=50)
    args = p.parse_args()
    location = resolve_model(None)
    tokenizer = load_tokenizer(load_checkpoint(str(location.path)))
    workers = TemplateWorkers()
    workers.start()
    try:
        here_us = median_us(args.renders, lambda: render_chat(tokenizer, MESSAGES,
                                                              without_template=refuse_without_template))
        worker_us = asyncio.run(median_us_in_thread(args.renders, lambda: render_chat(
            tokenizer, MESSAGES, without_template=refuse_without_template, renderer=workers.render)))
    finally:
        workers.close()
    with ServerProcess(["--model", str(location.path), "--log-level", "warning"]) as server:
        body = {"messages": MESSAGES, "max_tokens": 1}
        with httpx.Client(timeout=120.0) as client:
            request_ms = median_us(args.requests, lambda: client.post(server.base_url + "/chat/completions",
                                                                      json=body).raise_for_status()) / 1000
    print("| workload | in this process | in a worker, from a thread | added | a chat request (max_tokens 1) |")
    print("|---|---|---|---|---|")
    print(f"| built-in model's template, 2 turns, rendered and tokenized | {here_us:.0f} µs | {worker_us:.0f} µs | "
          f"{worker_us - here_us:.0f} µs | {request_ms:.1f} ms |")
    print(f"\n`python benchmarks/chat_template_cost.py --renders {args.renders} --requests {args.requests}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
