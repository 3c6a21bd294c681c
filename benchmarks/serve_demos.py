"""Serving demonstrations on the built-in model: each starts `tally serve` twice (or once), drives it
with `tally bench`, and prints one table: the workload, the two configurations, output tok/s, TTFT
P50/P99, ITL P99, goodput, the ratio last, and the command lines.

  static      continuous vs static batching, same closed loop (8 clients, 8 batch slots)
  prefix      prefix caching on vs off, every request behind one 1,000-token system prompt
  chunked     chunked prefill on vs off: a 1,500-token prompt lands among short decoding streams;
              the figure is the ITL P99 of the requests that were already decoding
  lengths     fixed lengths at the trace's mean vs the trace's own lengths, same rate and SLO:
              how much the naive test overstates goodput
  sweep       the same two workloads over a rate sweep (--sweep-rates): the highest rate at which each
              still meets the SLO for --slo-target of its requests is its capacity; the ratio is how
              much the fixed-length test overstates what the server can carry

Lengths come from the Azure conversation trace (tally/data), divided by --scale and clipped,
written to a CSV that `tally bench --lengths trace:FILE` resamples. The server runs with
OMP_NUM_THREADS=1: on a shared 2-core machine two OpenMP threads mostly wait on each other.

    python benchmarks/serve_demos.py [--only static,prefix,chunked,lengths,sweep] [--duration 30] [--scale 16]
                                     [--rate 0.5]
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

from tally.server.process import ServerProcess
from tally.traces import load_trace

SERVE_BASE = ["--max-model-len", "2048", "--kv-cache-memory", "512MiB", "--log-level", "warning"]
PROMPT_MAX, OUTPUT_MAX = 512, 64  # tokens, after scaling: keeps every run inside a minute here
LONG_PROMPT_TOKENS = 1500
PREFIX_GAP_S = 20.0  # about one uncached 1,000-token prefill plus its decode here


@dataclass
class Arm:
    label: str
    serve_args: list[str]
    bench_args: list[str]
    result: dict = field(default_factory=dict)
    ledger: dict = field(default_factory=dict)


@dataclass
class Demo:
    name: str
    title: str
    workload: str
    arms: list[Arm]
    headline: str  # the column whose ratio answers the demo's question
    extra: dict[str, tuple[Callable, Callable]] = field(default_factory=dict)  # more columns: name -> f(arm)


def scaled_trace(path: Path, scale: int) -> tuple[Path, float, float]:
    """The conversation trace's lengths / scale, clipped; returns the file and its mean lengths."""
    trace = load_trace("conv")
    prompt = np.clip(trace.prompt_tokens // scale, 1, PROMPT_MAX)
    output = np.clip(trace.output_tokens // scale, 1, OUTPUT_MAX)
    rows = "\n".join(f"{p},{o}" for p, o in zip(prompt, output))
    path.write_text("ContextTokens,GeneratedTokens\n" + rows + "\n")
    return path, float(prompt.mean()), float(output.mean())


SHORT_GAP_S, SHORT_PROMPT_TOKENS, SHORT_OUTPUT_TOKENS = 4.0, 32, 24


def long_prompt_at_s(duration_s: float) -> float:
    """A third of the way in, halfway between two short arrivals."""
    return SHORT_GAP_S * round(duration_s / 3 / SHORT_GAP_S) + SHORT_GAP_S / 2


def long_prompt_replay(path: Path, duration_s: float) -> Path:
    """Short requests every 4 s (2-3 decoding at once here) and one long prompt among them."""
    rows = [(t, SHORT_PROMPT_TOKENS, SHORT_OUTPUT_TOKENS) for t in np.arange(0.0, duration_s, SHORT_GAP_S)]
    rows.append((long_prompt_at_s(duration_s), LONG_PROMPT_TOKENS, 8))
    rows.sort()
    path.write_text("timestamp,ContextTokens,GeneratedTokens\n"
                    + "".join(f"{t:.3f},{p},{o}\n" for t, p, o in rows))
    return path


def warm_up(url: str) -> None:
    """One request first: the first forward passes of a fresh process are several times slower."""
    model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
    httpx.post(url + "/v1/completions", timeout=300, json={
        "model": model, "prompt": "The quality of mercy is not strained. " * 30, "max_tokens": 4})


def bench_command(url: str, args: list[str], out: Path) -> list[str]:
    return [sys.executable, "-m", "tally.cli", "bench", "--url", url, *args, "--quiet", "--out", str(out)]


def run_demo(demo: Demo, out_dir: Path) -> None:
    server, server_args = None, None
    try:
        for i, arm in enumerate(demo.arms):
            if arm.serve_args != server_args:  # arms with the same server share one
                if server is not None:
                    server.stop()
                server, server_args = ServerProcess(SERVE_BASE + arm.serve_args).start(), arm.serve_args
                warm_up(server.url)
            try:
                arm.result = run_bench(server.url, arm.bench_args, out_dir / f"{demo.name}_{i}.json")
            except RuntimeError as exc:
                raise RuntimeError(f"{demo.name} / {arm.label}: {exc}") from None
            arm.ledger = httpx.get(server.url + "/ledger", timeout=30).json()
    finally:
        if server is not None:
            server.stop()


def _ms(x: float | None) -> str:
    return "-" if x is None else (f"{x * 1e3:.0f} ms" if x < 10 else f"{x:.1f} s")


COLUMNS = {  # name -> (value from an arm, format)
    "output tok/s": (lambda a: a.result["summary"]["throughput"]["output_tokens_per_s"], "{:.1f}".format),
    "TTFT P50": (lambda a: a.result["summary"]["ttft_s"].get("p50"), _ms),
    "TTFT P99": (lambda a: a.result["summary"]["ttft_s"].get("p99"), _ms),
    "ITL P99": (lambda a: a.result["summary"]["itl_s"].get("p99"), _ms),
    "goodput req/s": (lambda a: a.result["summary"].get("goodput", {}).get("requests_per_s"), "{:.3f}".format),
    "met SLO": (lambda a: a.result["summary"].get("goodput", {}).get("fraction"), "{:.0%}".format),
    "ok/failed": (lambda a: "{ok}/{failed}".format(**a.result["summary"]["counts"]), str),
}


def table(demo: Demo) -> str:
    columns = {**COLUMNS, **demo.extra}
    a, b = demo.arms
    lines = [f"### {demo.title}", "", f"workload: {demo.workload}", "",
             "| configuration | " + " | ".join(columns) + " |",
             "|---|" + "---|" * len(columns)]
    for arm in demo.arms:
        cells = []
        for get, fmt in columns.values():
            value = get(arm)
            cells.append("-" if value is None else fmt(value))
        lines.append(f"| {arm.label} | " + " | ".join(cells) + " |")
    ratios = []
    for name, (get, _) in columns.items():
        va, vb = get(a), get(b)
        ok = isinstance(va, (int, float)) and isinstance(vb, (int, float)) and va
        ratios.append(f"{vb / va:.2f}×" if ok else "")
    ratios = [f"**{r}**" if n == demo.headline and r else r for n, r in zip(columns, ratios)]
    lines.append(f"| ratio {b.label.split()[0]} / {a.label.split()[0]} | " + " | ".join(ratios) + " |")
    lines += ["", "commands:", ""]
    for arm in demo.arms:
        serve = shlex.join(["OMP_NUM_THREADS=1", "tally", "serve", *SERVE_BASE, *arm.serve_args])
        lines.append(f"    {serve}")
        lines.append("    " + shlex.join(arm.result["command"]))
    warnings = [f"{arm.label}: {w}" for arm in demo.arms for w in arm.result.get("warnings", [])]
    lines += [""] + [f"warning: {w}" for w in warnings]
    return "\n".join(lines)


def decoding_itl(arm: Arm) -> tuple[float | None, float | None]:
    """ITL P99 and max of the requests that were decoding when the long prompt was sent."""
    records = arm.result["requests"]
    long = next(r for r in records if r["expected_prompt_tokens"] >= LONG_PROMPT_TOKENS)
    gaps = [g for r in records if r["error"] is None and r is not long
            and r["first_token_s"] < long["sent_s"] < r["end_s"] for g in r["itl_s"]]
    return (float(np.percentile(gaps, 99)), max(gaps)) if gaps else (None, None)


def long_ttft(arm: Arm) -> float | None:
    long = next(r for r in arm.result["requests"] if r["expected_prompt_tokens"] >= LONG_PROMPT_TOKENS)
    return None if long["first_token_s"] is None else long["first_token_s"] - long["sent_s"]


def demos(ns: argparse.Namespace, trace: Path, replay: Path, prompt_mean: float,
          output_mean: float) -> list[Demo]:
    lengths = f"trace:{trace}"
    slo = ["--slo", ns.slo]
    closed = ["--lengths", lengths, "--concurrency", "8", "--duration", f"{ns.duration}s", *slo]
    # Open loop with near-even gaps, not a closed loop: a closed loop bounded by --requests keeps
    # building prompts (/tokenize calls on the server) during the run, which slows the server.
    prefix = ["--lengths", lengths, "--system-prompt-tokens", "1000", "--prefix-share", "1.0",
              "--rate", f"{1 / PREFIX_GAP_S:g}", "--burstiness", "100",
              "--requests", str(ns.prefix_requests), *slo]
    rate = ["--rate", str(ns.rate), "--duration", f"{ns.duration}s", *slo]
    fixed = f"fixed:{round(prompt_mean)},{round(output_mean)}"
    traced = f"conv trace / {ns.scale} (prompt ≤ {PROMPT_MAX}, output ≤ {OUTPUT_MAX}; means " \
             f"{prompt_mean:.0f} / {output_mean:.0f} tokens)"
    hit = {"prefix hit rate": (lambda a: a.ledger["prefix_cache"]["hit_rate"], "{:.0%}".format)}
    return [
        Demo("static", "Continuous vs static batching",
             f"closed loop, 8 clients, {ns.duration} s; lengths {traced}; SLO {ns.slo}",
             [Arm("static (--scheduling static)", ["--scheduling", "static", "--max-num-seqs", "8"], closed),
              Arm("continuous (--scheduling continuous)", ["--max-num-seqs", "8"], closed)],
             "output tok/s"),
        Demo("prefix", "Prefix caching on vs off, shared 1,000-token system prompt",
             f"{ns.prefix_requests} requests, one every ~{PREFIX_GAP_S:g} s (gamma gaps, shape 100); "
             f"each = 1,000-token system prompt + "
             f"lengths {traced}; SLO {ns.slo}",
             [Arm("off (--no-enable-prefix-caching)", ["--no-enable-prefix-caching"], prefix),
              Arm("on (prefix caching, the default)", [], prefix)],
             "TTFT P50", hit),
        Demo("chunked", "Chunked prefill on vs off while a 1,500-token prompt arrives",
             f"replay of {replay.name}: a {SHORT_PROMPT_TOKENS}-token prompt / {SHORT_OUTPUT_TOKENS} "
             f"output tokens every {SHORT_GAP_S:g} s for {ns.duration} s, one {LONG_PROMPT_TOKENS}-token "
             f"prompt (8 output) at {long_prompt_at_s(ns.duration):g} s; "
             f"'decoding ITL' = gaps of the requests already decoding when it was sent; SLO {ns.slo}",
             [Arm("off (--no-enable-chunked-prefill, budget 2048)", ["--no-enable-chunked-prefill"],
                  ["--replay", str(replay), *slo]),
              Arm("on (--max-num-batched-tokens 256)", ["--max-num-batched-tokens", "256"],
                  ["--replay", str(replay), *slo])],
             "decoding ITL P99",
             {"decoding ITL P99": (lambda a: decoding_itl(a)[0], _ms),
              "decoding ITL max": (lambda a: decoding_itl(a)[1], _ms),
              "long prompt TTFT": (long_ttft, _ms)}),
        Demo("lengths", "Fixed lengths at the trace's mean vs trace-distributed lengths",
             f"Poisson {ns.rate} req/s, {ns.duration} s, same server (continuous, defaults); "
             f"{fixed} vs lengths {traced}; SLO {ns.slo}",
             [Arm(f"trace ({lengths.split('/')[-1]})", [], ["--lengths", lengths, *rate]),
              Arm(f"fixed ({fixed})", [], ["--lengths", fixed, *rate])],
             "goodput req/s"),
    ]


def run_bench(url: str, args: list[str], out: Path) -> dict:
    log = out.with_suffix(".log")
    with log.open("w") as handle:
        rc = subprocess.run(bench_command(url, args, out), stdout=handle, stderr=subprocess.STDOUT).returncode
    if rc != 0 or not out.exists():
        raise RuntimeError(f"tally bench exited {rc}; see {log}")
    return json.loads(out.read_text())


def capacity(rates: list[float], met: dict[float, float], target: float) -> float | None:
    """The highest rate at which this and every lower rate met the SLO for `target` of requests."""
    best = None
    for rate in sorted(rates):
        if met[rate] < target:
            break
        best = rate
    return best


def lengths_sweep(ns: argparse.Namespace, trace: Path, prompt_mean: float, output_mean: float) -> str:
    rates = [float(r) for r in ns.sweep_rates.split(",")]
    workloads = {"trace": f"trace:{trace}", "fixed": f"fixed:{round(prompt_mean)},{round(output_mean)}"}
    met: dict[str, dict[float, float]] = {name: {} for name in workloads}
    lines = ["### Capacity: fixed lengths at the trace's mean vs trace lengths, over a rate sweep", "",
             f"workload: Poisson arrivals, {ns.duration} s per rate, one server (continuous, defaults); "
             f"{workloads['fixed']} vs lengths conv trace / {ns.scale} (means {prompt_mean:.0f} / "
             f"{output_mean:.0f}); SLO {ns.slo}; capacity = highest rate with ≥ {ns.slo_target:.0%} of "
             f"requests within the SLO (and every lower rate too)", "",
             "| rate req/s | " + " | ".join(f"{w} {c}" for w in workloads for c in ("met SLO", "goodput req/s",
                                                                                    "TTFT P99", "out tok/s")) + " |",
             "|---|" + "---|" * 4 * len(workloads)]
    server = ServerProcess(SERVE_BASE).start()
    try:
        warm_up(server.url)
        for rate in rates:
            cells = []
            for name, lengths in workloads.items():
                result = run_bench(server.url, ["--lengths", lengths, "--rate", f"{rate:g}", "--duration",
                                                f"{ns.duration}s", "--slo", ns.slo, "--seed", "1"],
                                   ns.out_dir / f"sweep_{name}_{rate:g}.json")
                summary = result["summary"]
                met[name][rate] = summary["goodput"]["fraction"]
                cells += [f"{met[name][rate]:.0%}", f"{summary['goodput']['requests_per_s']:.3f}",
                          _ms(summary["ttft_s"].get("p99")),
                          f"{summary['throughput']['output_tokens_per_s']:.1f}"]
            lines.append(f"| {rate:g} | " + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
    finally:
        server.stop()
    cap = {name: capacity(rates, met[name], ns.slo_target) for name in workloads}
    ratio = (f"{cap['fixed'] / cap['trace']:.1f}×" if cap["fixed"] and cap["trace"] else
             "not defined (a workload met the SLO at no rate of the sweep)")
    lines += ["", f"capacity: trace {cap['trace']} req/s, fixed {cap['fixed']} req/s; "
                  f"the fixed-length test overstates capacity **{ratio}**",
              "", f"command: python benchmarks/serve_demos.py --only sweep --sweep-rates {ns.sweep_rates} "
                  f"--duration {ns.duration} --scale {ns.scale} --slo {ns.slo} --slo-target {ns.slo_target}"]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="static,prefix,chunked,lengths")
    p.add_argument("--duration", type=int, default=30, help="seconds of load per run")
    p.add_argument("--scale", type=int, default=16, help="trace lengths are divided by this")
    p.add_argument("--rate", type=float, default=0.5, help="req/s of the fixed-vs-trace runs")
    p.add_argument("--prefix-requests", type=int, default=5, help="requests per prefix-caching run")
    p.add_argument("--slo", default="ttft=5s,tpot=1s")
    p.add_argument("--sweep-rates", default="0.1,0.2,0.3,0.5,0.8", help="req/s of the capacity sweep")
    p.add_argument("--slo-target", type=float, default=0.9, help="share of requests within the SLO")
    p.add_argument("--out-dir", type=Path, default=Path("/tmp/tally_serve_demos"))
    ns = p.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"  # inherited by every `tally serve` started below
    ns.out_dir.mkdir(parents=True, exist_ok=True)
    trace, prompt_mean, output_mean = scaled_trace(ns.out_dir / f"conv_div{ns.scale}.csv", ns.scale)
    replay = long_prompt_replay(ns.out_dir / "long_prompt_replay.csv", ns.duration)
    chosen = ns.only.split(",")
    started = time.monotonic()
    if "sweep" in chosen:
        t0 = time.monotonic()
        print(lengths_sweep(ns, trace, prompt_mean, output_mean),
              f"\n({time.monotonic() - t0:.0f} s, load average {os.getloadavg()[0]:.1f})\n", flush=True)
    for demo in demos(ns, trace, replay, prompt_mean, output_mean):
        if demo.name not in chosen:
            continue
        t0 = time.monotonic()
        try:
            run_demo(demo, ns.out_dir)
        except RuntimeError as exc:
            print(f"### {demo.title}\n\nnot run: {exc}\n", flush=True)
            continue
        print(table(demo), f"\n({time.monotonic() - t0:.0f} s, load average {os.getloadavg()[0]:.1f})\n",
              flush=True)
    print(f"total {time.monotonic() - started:.0f} s\ncommand: python {shlex.join(sys.argv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
