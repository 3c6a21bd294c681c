"""Length pools: the short requests' TTFT P99 behind `tally route` when the long tail has its own pool vs when both
replicas form one mixed pool; same two `tally serve` replicas, same trace (a share of long prompts), same run.

    python benchmarks/length_pools.py [--requests 40] [--long-share 0.15] [--long-tokens 1200] [--concurrency 4]
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from tally.server.process import ServerProcess

SERVE = ["--dtype", "float32", "--max-model-len", "2048", "--threads", "1", "--log-level", "warning"]


def _router(*args: str) -> ServerProcess:
    return ServerProcess([], command=lambda port: [sys.executable, "-m", "tally.cli", "route", *args, "--port",
                                                   str(port), "--health-interval", "0.5", "--log-level", "warning"])


def _ttft_s(url: str, prompt: str, max_tokens: int) -> float:
    start, last = time.perf_counter(), ""
    with httpx.stream("POST", url + "/v1/completions", timeout=600, json={
            "model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and '"choices"' in line:
                return time.perf_counter() - start
            last = line
    raise RuntimeError(f"no token from {url}: {r.status_code} {last}")


def run(url: str, trace: list[tuple[str, int, bool]], concurrency: int) -> list[float]:
    """The short requests' TTFTs, the trace sent `concurrency` at a time."""
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda item: (_ttft_s(url, item[0], item[1]), item[2]), trace))
    return [t for t, long in results if not long]


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98] if len(values) > 1 else values[0]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=40)
    p.add_argument("--long-share", type=float, default=0.15)
    p.add_argument("--long-tokens", type=int, default=1200, help="long prompts' words (about tokens)")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--model", default="smollm2-135m")
    a = p.parse_args()
    rng = random.Random(0)
    trace = []
    for i in range(a.requests):
        long = rng.random() < a.long_share
        words = (a.long_tokens if long else 40) // 3  # "w12" is about three tokens
        trace.append((" ".join(f"w{rng.randrange(50)}" for _ in range(words)) + f" {i}", 16, long))
    threshold = str(a.long_tokens // 2)
    servers = [ServerProcess([a.model, "--served-model-name", "m", *SERVE]) for _ in range(2)]
    for s in servers:
        s.start()
    try:
        rows = []
        for label, args in (("one mixed pool", ["--replica", servers[0].url, "--replica", servers[1].url]),
                            ("main + long pool", ["--pool", f"main={servers[0].url}", "--pool",
                                                  f"long={servers[1].url}", "--long-pool", "long",
                                                  "--long-threshold", threshold])):
            with _router(*args) as router:
                time.sleep(1.5)  # the pools' max_model_len, read from the replicas
                rows.append((label, p99(run(router.url, trace, a.concurrency))))
    finally:
        for s in servers:
            s.stop()
    print(f"workload: {a.requests} requests, {a.long_share:.0%} with ~{a.long_tokens}-token prompts, the rest 40, "
          f"16 out, {a.concurrency} at a time; 2 replicas of {a.model}")
    print(f"{'setup':<18} {'short TTFT P99 (s)':>20}")
    for label, value in rows:
        print(f"{label:<18} {value:>20.3f}")
    print(f"ratio (mixed / pools): {rows[0][1] / rows[1][1]:.2f}")
    print("command: python benchmarks/length_pools.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
