"""`tally eval`: candidate vs baseline on perplexity, task suites and a long-tail suite; exit 1 on no-go.
With --suite, on your own tasks instead (models loaded here or served at a URL), judged by your --rules.

    tally eval --baseline M --candidate M --candidate-quantization int4 [--out report.json]
    tally eval --suite tasks.jsonl --baseline http://stable:8000 --candidate http://canary:8000 --rules rules.yaml
"""
from __future__ import annotations

import argparse
import logging
import shlex
import sys

from tally.errors import TallyError
from tally.flags import (
    DTYPE,
    JSON,
    KV_CACHE_DTYPE,
    KV_CACHE_MEMORY,
    MAX_MODEL_LEN,
    MAX_TOKENS,
    OUT,
    QUANTIZATION,
    QUIET,
    THREADS,
    parser,
)
from tally.quality import suite_cli
from tally.quality.report_output import write_report
from tally.quality.settings import SUITES, VERDICTS, Decoding, EvalSettings, Thresholds

EXIT_NO_GO = 1
EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    p = parser("tally eval", __doc__)
    for who in ("baseline", "candidate"):
        p.add_argument(f"--{who}", default=None, help="checkpoint dir, .gguf file or alias (default: built-in model); "
                       "with --suite also a server's URL")
        QUANTIZATION.add(p, prefix=who)
        KV_CACHE_DTYPE.add(p, prefix=who, note="; int8 with the weights unchanged gates the KV quantization alone")
    p.add_argument("--candidate-corrupt", default=None, metavar="zero-layer:N",
                   help="damage the candidate on purpose, to check that the gate fails it")
    DTYPE.add(p, note="; both models")
    MAX_MODEL_LEN.add(p, default=2048, note="; both models, and long-tail inputs fill it")
    KV_CACHE_MEMORY.add(p, note="; each model's")
    p.add_argument("--suites", default=",".join(SUITES), help=f"comma-separated subset of {','.join(SUITES)}")
    p.add_argument("--ppl-tokens", type=int, default=4096, help="held-out tokens scored for perplexity")
    p.add_argument("--ppl-window", type=int, default=1024, help="tokens per perplexity window (≤ max-model-len)")
    MAX_TOKENS.add(p, default=64, note=": greedy tokens per task / long-tail item")
    p.add_argument("--batch-size", type=int, default=32, help="requests decoded together (same for both)")
    p.add_argument("--limit", type=int, default=None, help="items per suite file (default: all)")
    p.add_argument("--thresholds", nargs="*", default=[], metavar="NAME=WARN,FAIL",
                   help="e.g. ppl=2,5 tasks=5,15 longtail=40,75 (losses: %% ppl up, points down, %% disagree)")
    p.add_argument("--fail-on", default="fail", choices=VERDICTS[1:], help="verdict from which the exit code is 1")
    OUT.add(p, note=": the report as JSON")
    JSON.add(p)
    THREADS.add(p, note="; both models")
    QUIET.add(p)
    suite_cli.add_arguments(p)
    return p


def main(argv: list[str]) -> int:
    p = build_parser()
    ns = p.parse_args(argv)
    logging.getLogger("tally.quality").setLevel(logging.WARNING if ns.quiet else logging.INFO)
    logging.basicConfig(format="tally eval: %(message)s")
    command = "tally eval " + shlex.join(argv)
    try:
        suite_cli.check_options(ns, p.parse_args([]))
    except TallyError as exc:
        print(f"tally eval: {exc.message}", file=sys.stderr)
        return EXIT_USAGE
    if ns.suite:
        return suite_cli.main(ns, command, EXIT_USAGE, EXIT_NO_GO)
    try:
        settings = EvalSettings(
            suites=tuple(s.strip() for s in ns.suites.split(",") if s.strip()),
            decoding=Decoding(max_tokens=ns.max_tokens, batch_size=ns.batch_size),
            thresholds=Thresholds.parse(ns.thresholds), ppl_tokens=ns.ppl_tokens, ppl_window_tokens=ns.ppl_window,
            limit=ns.limit)
        from tally.quality.gate import run_gate
        from tally.quality.model_run import ModelSpec
        from tally.quality.report import json_text, print_table

        common = dict(dtype=ns.dtype, max_model_len=ns.max_model_len, kv_cache_memory=ns.kv_cache_memory,
                      threads=ns.threads)
        baseline = ModelSpec(ns.baseline, ns.baseline_quantization, kv_cache_dtype=ns.baseline_kv_cache_dtype, **common)
        candidate = ModelSpec(ns.candidate, ns.candidate_quantization, kv_cache_dtype=ns.candidate_kv_cache_dtype,
                              corrupt=ns.candidate_corrupt, **common)
        report = run_gate(baseline, candidate, settings, fail_on=ns.fail_on, progress=not ns.quiet)
    except TallyError as exc:
        print(f"tally eval: {exc.message}", file=sys.stderr)
        return EXIT_USAGE
    write_report(report, ns, command, json_text, print_table)
    return 0 if report.go else EXIT_NO_GO
