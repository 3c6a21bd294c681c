"""`tally bench`: load-test any OpenAI-compatible server; `tally bench compare A.json B.json`.

Ctrl-C or --time-limit stops a run early and still writes every report for what finished, marked
partial. Exit status: 0; 1 no request succeeded; 2 usage or configuration error; 3 stopped by
--time-limit; 130 interrupted (Ctrl-C)."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tally.bench.arrivals import RateArrivals, ReplayArrivals, parse_phases
from tally.bench.benchmark import BenchConfig, run_benchmark
from tally.bench.length_samplers import (
    LogNormalLengths,
    fit_lognormal,
    ks_statistic,
    parse_lengths,
)
from tally.bench.report_formats import FORMATS, render
from tally.bench.runner import (
    DEFAULT_GRACE_S,
    INTERRUPTED,
    TIME_LIMIT,
    StoppedBeforeSending,
)
from tally.bench.stats import Slo
from tally.bench.workload import WorkloadConfig
from tally.errors import ConfigError, TallyError
from tally.flags import CONCURRENCY, OUT, QUIET, parser
from tally.traces import load_trace
from tally.units import parse_duration_s, parse_rate_per_s

EXAMPLES = """examples:
  tally bench --url http://127.0.0.1:8000 --rate 5 --duration 60s --slo ttft=2s,tpot=100ms
  tally bench --url URL --phases "5/s:10s,50/s:2s,5/s:20s" --out run.json --html report.html
  tally bench --url URL --lengths trace:conv --replay conv --time-scale 0.1 --duration 60s
  tally bench --url URL --concurrency 32 --requests 500 --lengths fixed:512,256
  tally bench --url URL --rate 2 --soak 1h --sample 30s --server-pid 1234
  tally bench --url URL --rate 5 --requests 1000 --time-limit 10m --out run.json
  tally bench --fit conv
  tally bench compare base.json candidate.json --threshold 10%"""


EXIT_TIME_LIMIT = 3  # stopped by --time-limit; the reports hold what finished
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), as shells report it


def _typed(parse: Callable[[str], object]) -> Callable[[str], object]:
    """An argparse type that shows our error message instead of 'invalid value'."""
    def convert(text: str) -> object:
        try:
            return parse(text)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(exc.message) from None
    convert.__name__ = parse.__name__
    return convert


def build_parser() -> argparse.ArgumentParser:
    p = parser("tally bench", __doc__, EXAMPLES)
    p.add_argument("--url", help="server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", help="model name to request (default: the server's first model)")
    p.add_argument("--endpoint", choices=["completions", "chat"], default="completions",
                   help="/v1/completions or /v1/chat/completions")
    w = p.add_argument_group("workload")
    w.add_argument("--lengths", help="lognormal:k=v,... | fixed:PROMPT,OUTPUT | trace:FILE "
                   f"(default {LogNormalLengths().spec()})")
    w.add_argument("--fit", metavar="FILE", help="fit log-normal lengths to a log, print, exit")
    w.add_argument("--system-prompt-tokens", type=int, default=0,
                   help="tokens of the system prompt the --prefix-share requests start with")
    w.add_argument("--prefix-share", type=float, default=0.0,
                   help="fraction of requests that start with the shared system prompt")
    w.add_argument("--seed", type=int, default=0, help="seed of the workload: lengths, prompts and arrivals")
    a = p.add_argument_group("arrivals (one of; default --concurrency 1; --concurrency with an open-loop one caps "
                             "the requests in flight, as vLLM's --max-concurrency)")
    a.add_argument("--rate", type=_typed(parse_rate_per_s), help="Poisson arrivals, requests/s")
    a.add_argument("--burstiness", type=float, default=1.0,
                   help="gamma shape of the gaps: 1 Poisson, <1 burstier, >1 steadier")
    a.add_argument("--phases", type=_typed(parse_phases), help='contiguous rates, "5/s:10s,50/s:2s"')
    a.add_argument("--replay", metavar="FILE", help="send at a trace's timestamps")
    a.add_argument("--time-scale", type=float, default=1.0, help="replay gaps × this")
    CONCURRENCY.add(a, note=": a closed loop with N workers; with --rate, --phases or --replay at most N (a "
                            "request waits for a slot; the wait shows as lateness, not latency)")
    r = p.add_argument_group("run")
    r.add_argument("--duration", type=_typed(parse_duration_s),
                   help="how long to send, e.g. 60s (default: 60s, unless --requests, --phases or --replay end the "
                        "run)")
    r.add_argument("--requests", type=int, help="measured requests (warmup comes on top)")
    r.add_argument("--warmup", type=_typed(parse_duration_s), default="0s",
                   help="time sent before measuring starts; its requests are not reported")
    r.add_argument("--timeout", type=_typed(parse_duration_s), default="300s", help="seconds one request may take")
    r.add_argument("--slo", type=_typed(Slo.parse), help="e.g. ttft=2s,tpot=100ms,e2e=20s")
    r.add_argument("--time-limit", type=_typed(parse_duration_s),
                   help="stop sending after this much run time and report what finished "
                        "(partial; exit status 3)")
    r.add_argument("--grace", type=_typed(parse_duration_s), default=DEFAULT_GRACE_S,
                   help="after Ctrl-C or --time-limit, how long requests in flight may finish "
                        "before they are cancelled")
    r.add_argument("--soak", type=_typed(parse_duration_s), help="long run with sampling and a verdict")
    r.add_argument("--sample", type=_typed(parse_duration_s), help="sampling interval (soak: 30s)")
    r.add_argument("--server-pid", type=int, help="read this local process's RSS when sampling")
    r.add_argument("--tokenizer", type=Path, help="local tokenizer.json (default: /tokenize)")
    r.add_argument("--api-key", help="sent as 'Authorization: Bearer KEY' (default: $OPENAI_API_KEY)")
    r.add_argument("--extra-body", type=json.loads, default={}, help="JSON merged into requests")
    o = p.add_argument_group("output")
    OUT.add(o, note=": a JSON result with every request record, in --format's shape")
    o.add_argument("--format", default="tally", choices=FORMATS,
                   help="what --out holds: tally's JSON (read by tally plan/alerts), vLLM's benchmark_serving.py "
                        "result JSON, GuideLLM's benchmarks.json report, or one CSV row per request")
    o.add_argument("--html", type=Path, help="self-contained HTML report with plots")
    QUIET.add(o)
    return p


def _arrivals(args: argparse.Namespace) -> RateArrivals | ReplayArrivals | None:
    chosen = [n for n in ("rate", "phases", "replay") if getattr(args, n) is not None]
    if len(chosen) > 1:
        raise ConfigError(f"choose one arrival process, not {chosen}")
    if args.burstiness <= 0:
        raise ConfigError("--burstiness must be > 0 (1 = Poisson)")
    if args.phases:
        return RateArrivals(args.phases[0][0], args.burstiness, args.phases)
    if args.rate:
        return RateArrivals(args.rate, args.burstiness)
    if args.replay:
        trace = load_trace(args.replay)
        if trace.arrival_s is None:
            raise ConfigError(f"--replay {args.replay}: the trace has no timestamp column")
        return ReplayArrivals(trace.arrival_s, args.time_scale)
    return None


def workload_from_args(args: argparse.Namespace) -> WorkloadConfig:
    arrivals = _arrivals(args)
    duration_s = args.soak if args.soak is not None else args.duration
    if arrivals is None and args.concurrency is None:
        args.concurrency = 1
    if duration_s is None and args.requests is None and not args.phases and not args.replay:
        duration_s = 60.0
    replay = load_trace(args.replay) if args.replay else None
    lengths = parse_lengths(args.lengths) if args.lengths else (None if replay else LogNormalLengths())
    return WorkloadConfig(lengths, arrivals, args.concurrency, duration_s, args.requests,
                          args.warmup, args.seed, args.system_prompt_tokens, args.prefix_share,
                          replay)


def _fit(path: str) -> int:
    trace = load_trace(path)
    fit = fit_lognormal(trace)
    print(f"{len(trace)} requests in {trace.source}")
    for name, data, median, sigma in (
            ("prompt", trace.prompt_tokens, fit.prompt_median, fit.prompt_sigma),
            ("output", trace.output_tokens, fit.output_median, fit.output_sigma)):
        ks = ks_statistic(np.maximum(data, 1), median, sigma)
        print(f"  {name}: median {median:g}, sigma {sigma:g} (KS distance of the fit {ks:.3f})")
    print(f"--lengths {fit.spec()}")
    return 0


def _redacted(argv: list[str]) -> list[str]:
    """The command line as reports keep it: without the API key."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--api-key" and i + 1 < len(out):
            out[i + 1] = "***"
        elif arg.startswith("--api-key="):
            out[i] = "--api-key=***"
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["compare"]:
            from tally.bench.run_diff import main as compare_main
            return compare_main(argv[1:])
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exc:  # --help, or a usage error argparse already printed
            return int(exc.code or 0)
        if args.fit:
            return _fit(args.fit)
        if not args.url:
            raise ConfigError("--url is required, e.g. --url http://127.0.0.1:8000")
        if args.time_limit is not None and args.time_limit <= 0:
            raise ConfigError("--time-limit must be > 0, e.g. --time-limit 10m")
        sample_s = args.sample if args.sample is not None else (30.0 if args.soak else None)
        config = BenchConfig(
            url=args.url.rstrip("/"), workload=workload_from_args(args), model=args.model,
            endpoint=args.endpoint, slo=args.slo, timeout_s=args.timeout,
            tokenizer_path=args.tokenizer, api_key=args.api_key or os.environ.get("OPENAI_API_KEY"),
            extra_body=tuple(args.extra_body.items()), sample_s=sample_s,
            server_pid=args.server_pid, progress=not args.quiet and sys.stderr.isatty(),
            time_limit_s=args.time_limit, grace_s=args.grace, stop_on_sigint=True)
        result = asyncio.run(run_benchmark(config, ["tally", "bench", *_redacted(argv)]))
    except TallyError as exc:
        print(f"tally bench: {exc.message}", file=sys.stderr)
        return 2
    except StoppedBeforeSending:
        print("tally bench: interrupted before any request was sent; no report written",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:  # before sending started (probe, tokenizer), where Ctrl-C is plain
        print("tally bench: interrupted; no report written", file=sys.stderr)
        return EXIT_INTERRUPTED
    from tally.bench.report_text import print_report
    print_report(result)
    if args.out:
        from tally.bench.report_json import write_result
        if args.format == "tally":
            write_result(result, args.out)
        else:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(render(result, args.format))
    if args.html:
        from tally.bench.report_html import write_html
        write_html(result, args.html)
    if result["partial"]:
        written = [str(p) for p in (args.out, args.html) if p]
        print(f"tally bench: partial report ({result['stopped']['detail']})"
              f"{' written to ' + ', '.join(written) if written else ''}", file=sys.stderr)
        return {INTERRUPTED: EXIT_INTERRUPTED, TIME_LIMIT: EXIT_TIME_LIMIT}[result["stopped"]["reason"]]
    return 1 if result["summary"]["counts"]["ok"] == 0 else 0
