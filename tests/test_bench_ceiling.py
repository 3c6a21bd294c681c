"""The client at 500 requests/s against a trivial streaming server (its own process): every
scheduled request is sent, completes, and is accounted for. Tests never assert wall-clock figures
(CI machines are shared and noisy), so the achieved rate and lateness are printed, not asserted;
docs/bench.md records the measured ceiling and the command that measured it."""
from __future__ import annotations

import asyncio

import numpy as np
from support.bench_servers import serve

from tally.bench.arrivals import RateArrivals
from tally.bench.benchmark import BenchConfig, run_benchmark
from tally.bench.length_samplers import FixedLengths
from tally.bench.workload import WorkloadConfig

RATE_PER_S = 500.0


def test_client_sustains_500_requests_per_second_against_a_trivial_server():
    workload = WorkloadConfig(FixedLengths(16, 4), RateArrivals(RATE_PER_S), duration_s=3.0)
    with serve() as server:
        result = asyncio.run(run_benchmark(BenchConfig(server.url, workload, progress=False)))
    requests = result["requests"]
    assert result["summary"]["counts"]["failed"] == 0
    assert len(requests) >= 0.9 * RATE_PER_S * 3.0  # the open loop scheduled the whole run
    assert all(r["error"] is None and r["output_tokens"] == 4 for r in requests)
    sent = np.array([r["sent_s"] for r in requests])
    print(f"achieved send rate {(len(sent) - 1) / (sent.max() - sent.min()):.0f} req/s, "
          f"lateness P50 {result['summary']['lateness_s']['p50'] * 1e3:.1f} ms")
