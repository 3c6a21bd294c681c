"""Ray Serve replicas next to one `tally serve`: what `tally serve --ray` buys and what Ray's proxy costs.

Three servers in turn on the built-in model, each driven by `tally bench`:
  direct      tally serve --threads 1 (one engine thread, as each Ray replica has)
  ray x1      tally serve --ray --replicas 1 (Ray's HTTP proxy -> OpenAiIngress -> one LLMServer replica)
  ray x2      tally serve --ray --replicas 2
Two tables: the trace workload (closed loop, --concurrency clients, lengths from the Azure conversation trace
divided by --scale, as benchmarks/serve_demos.py) with req/s and TTFT; and the cost of Ray's hops per request (a
1-token answer to a 16-token prompt, one client, E2E P50), whose ratio to direct is the proxy overhead.
Servers run with OMP_NUM_THREADS=1; on a 2-core machine two replicas share the cores with Ray's own processes.

    python benchmarks/ray_replicas.py [--duration 30] [--concurrency 8] [--scale 16] [--overhead-requests 100]
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

from serve_demos import SERVE_BASE, _ms, run_bench, scaled_trace, warm_up

from tally.server.process import ServerProcess

ARMS = {"direct": ["--threads", "1"], "ray x1": ["--ray", "--replicas", "1"], "ray x2": ["--ray", "--replicas", "2"]}
OVERHEAD_LENGTHS = "fixed:16,1"


def measure(arm: str, ns: argparse.Namespace, trace: Path) -> tuple[dict, dict]:
    with ServerProcess(SERVE_BASE + ARMS[arm], startup_timeout_s=600) as server:
        warm_up(server.url)
        traced = run_bench(server.url, ["--lengths", f"trace:{trace}", "--concurrency", str(ns.concurrency),
                                        "--duration", f"{ns.duration}s", "--seed", "1"],
                           ns.out_dir / f"trace_{arm.replace(' ', '')}.json")
        hops = run_bench(server.url, ["--lengths", OVERHEAD_LENGTHS, "--concurrency", "1", "--requests",
                                      str(ns.overhead_requests), "--seed", "1"],
                         ns.out_dir / f"hops_{arm.replace(' ', '')}.json")
    return traced, hops


def tables(results: dict[str, tuple[dict, dict]], ns: argparse.Namespace, trace_note: str) -> str:
    def summary(arm: str, i: int) -> dict:
        return results[arm][i]["summary"]

    lines = [f"workload: closed loop, {ns.concurrency} clients, {ns.duration} s; lengths {trace_note}", "",
             "| server | req/s | output tok/s | TTFT P50 | TTFT P99 | ok/failed |", "|---|---|---|---|---|---|"]
    for arm in results:
        s = summary(arm, 0)
        lines.append(f"| {arm} | {s['throughput']['requests_per_s']:.2f} | "
                     f"{s['throughput']['output_tokens_per_s']:.1f} | {_ms(s['ttft_s'].get('p50'))} | "
                     f"{_ms(s['ttft_s'].get('p99'))} | {s['counts']['ok']}/{s['counts']['failed']} |")
    for a, b in (("ray x1", "direct"), ("ray x2", "ray x1")):
        ta, tb = summary(a, 0)["throughput"], summary(b, 0)["throughput"]
        ttft_ratio = summary(a, 0)["ttft_s"]["p99"] / summary(b, 0)["ttft_s"]["p99"]
        lines.append(f"| ratio {a} / {b} | {ta['requests_per_s'] / tb['requests_per_s']:.2f}× | "
                     f"{ta['output_tokens_per_s'] / tb['output_tokens_per_s']:.2f}× | | {ttft_ratio:.2f}× | |")
    direct_s = summary("direct", 1)["e2e_s"]["p50"]
    lines += ["", f"Ray's hops per request: {ns.overhead_requests} requests, one client, {OVERHEAD_LENGTHS} "
                  f"(prompt, output tokens)", "", "| server | E2E P50 | added per request | ratio to direct |",
              "|---|---|---|---|"]
    for arm in results:
        e2e_s = summary(arm, 1)["e2e_s"]["p50"]
        lines.append(f"| {arm} | {_ms(e2e_s)} | {(e2e_s - direct_s) * 1e3:+.1f} ms | {e2e_s / direct_s:.2f}× |")
    lines += ["", "commands:", ""]
    for arm in results:
        lines.append("    " + shlex.join(["OMP_NUM_THREADS=1", "tally", "serve", *SERVE_BASE, *ARMS[arm]]))
        lines += ["    " + shlex.join(results[arm][i]["command"]) for i in (0, 1)]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=int, default=30, help="seconds of trace load per server")
    p.add_argument("--concurrency", type=int, default=8, help="clients of the trace workload")
    p.add_argument("--scale", type=int, default=16, help="trace lengths are divided by this")
    p.add_argument("--overhead-requests", type=int, default=100)
    p.add_argument("--out-dir", type=Path, default=Path("/tmp/tally_ray_replicas"))
    ns = p.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"  # inherited by every server and Ray worker started below
    ns.out_dir.mkdir(parents=True, exist_ok=True)
    trace, prompt_mean, output_mean = scaled_trace(ns.out_dir / f"conv_div{ns.scale}.csv", ns.scale)
    started = time.monotonic()
    results = {arm: measure(arm, ns, trace) for arm in ARMS}
    note = f"conv trace / {ns.scale} (means {prompt_mean:.0f} / {output_mean:.0f} tokens)"
    print(tables(results, ns, note))
    print(f"\n{time.monotonic() - started:.0f} s, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}\n"
          f"command: python {shlex.join(sys.argv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
