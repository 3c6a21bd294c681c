"""Inter-token latency a team can promise under production-shaped load: `tally serve` on the built-in model with
default settings, driven by `tally bench`'s own workload (log-normal prompt and output lengths with a long tail) in
bursts (gamma gaps, --burstiness) at the server's measured capacity.

    python benchmarks/itl_under_trace.py [--clients 16] [--capacity-duration 60] [--requests 80] [--load 1.0]
        [--seed 2] [--attribute]

Steps: start the server; measure its capacity (a closed loop of --clients, the same lengths: requests completed per
second while it sends, past its first --warmup seconds, so neither the ramp nor the drain of the long tail counts);
send --requests bursty open-loop arrivals (after --warmup seconds of them) at --load x that rate, the lengths and
arrivals drawn from --seed; print ITL P50/P90/P99/max and P99 / P50 (goal: <= 3x), TTFT P50/P99. Exit status 1 when
the goal is missed. --attribute: the server logs its steps (--step-log) and each gap over 3x the median is put down
to a long step, steps the stream sat out, delivery, or time between steps (tally/bench/gap_attribution.py).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from tally.bench.gap_attribution import describe, long_gaps, read_steps
from tally.server.process import ServerProcess

GOAL = 3.0  # ITL P99 within this many times its P50


def bench(url: str, out: Path, *args: str) -> dict:
    subprocess.run([sys.executable, "-m", "tally.cli", "bench", "--url", url, "--quiet", "--out", str(out), *args],
                   check=True)
    return json.loads(out.read_text())


def completed_per_s(run: dict, start_s: float, end_s: float) -> float:
    """Requests of a `tally bench` run that completed between `start_s` and `end_s` of its run time, per second."""
    done = [r for r in run["requests"] if r["error"] is None and r["end_s"] is not None]
    return sum(start_s <= r["end_s"] <= end_s for r in done) / (end_s - start_s)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=16, help="closed-loop clients of the capacity run")
    p.add_argument("--capacity-duration", type=int, default=60, help="seconds of the capacity run")
    p.add_argument("--requests", type=int, default=80, help="measured requests of the bursty run (after --warmup)")
    p.add_argument("--duration", type=int, help="seconds of the bursty run (after --warmup) instead of --requests")
    p.add_argument("--seed", type=int, default=2, help="seed of the bursty run's lengths, prompts and arrivals")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--rate", type=float, help="req/s of the bursty run instead of measuring capacity")
    p.add_argument("--load", type=float, default=1.0, help="the bursty run's rate as a share of capacity")
    p.add_argument("--burstiness", type=float, default=0.5, help="gamma shape of the gaps (1 Poisson, < 1 bursty)")
    p.add_argument("--serve-args", default="", help="extra `tally serve` flags")
    p.add_argument("--attribute", action="store_true", help="put each gap over 3x the median down to its cause")
    p.add_argument("--keep", type=Path, help="folder to keep the bench results (and the step log) in")
    ns = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) if ns.keep is None else ns.keep
        out.mkdir(parents=True, exist_ok=True)
        step_log = ["--step-log", str(out / "steps.jsonl")] if ns.attribute else []
        server = ServerProcess(["--log-level", "warning", *step_log, *ns.serve_args.split()]).start()
        try:
            bench(server.url, out / "warm.json", "--requests", "4", "--concurrency", "4")
            if ns.rate is None:
                closed = bench(server.url, out / "capacity.json", "--concurrency", str(ns.clients),
                               "--duration", f"{ns.capacity_duration}s", "--seed", "1")
                capacity = completed_per_s(closed, ns.warmup, ns.capacity_duration)
            else:
                capacity = ns.rate / ns.load
            rate = capacity * ns.load
            length = ["--requests", str(ns.requests)] if ns.duration is None else ["--duration", f"{ns.duration}s"]
            run = bench(server.url, out / "bursty.json", "--rate", f"{rate:.4f}", "--burstiness",
                        str(ns.burstiness), *length, "--warmup", f"{ns.warmup}s",
                        "--seed", str(ns.seed))
        finally:
            server.stop()
        if ns.attribute:
            steps = [s for s in read_steps((out / "steps.jsonl").read_text().splitlines())
                     if s.start_s >= run["clock_origin_s"]]
            median_s, gaps = long_gaps(run, steps, GOAL)
    s = run["summary"]
    itl, ttft = s["itl_s"], s["ttft_s"]
    ratio = itl["p99"] / itl["p50"]
    print(f"capacity ({ns.clients} clients, closed loop): {capacity:.3f} req/s; bursty run at {rate:.3f} req/s "
          f"(burstiness {ns.burstiness}): {s['counts']['ok']} requests")
    print("ITL P50 / P90 / P99 / max: " + " / ".join(f"{itl[k] * 1000:.0f} ms" for k in ("p50", "p90", "p99", "max"))
          + f"; P99 / P50 {ratio:.2f}x ({'met' if ratio <= GOAL else 'missed'}: goal <= {GOAL:g}x)")
    print(f"TTFT P50 / P99: {ttft['p50']:.2f} / {ttft['p99']:.2f} s")
    if ns.attribute:
        print("\n".join(describe(median_s, gaps, steps, GOAL)))
    run_length = f"--requests {ns.requests}" if ns.duration is None else f"--duration {ns.duration}"
    print(f"command: python benchmarks/itl_under_trace.py --clients {ns.clients} --capacity-duration "
          f"{ns.capacity_duration} {run_length} --load {ns.load} --burstiness {ns.burstiness} --seed {ns.seed}"
          + (" --attribute" if ns.attribute else "") + (f" --rate {ns.rate}" if ns.rate else ""))
    return 0 if ratio <= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
