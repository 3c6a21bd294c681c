"""`tally eval`: candidate vs baseline on perplexity, task suites and a long-tail suite; exit 1 on no-go.

    tally eval --baseline M --candidate M --candidate-quantization int4 [--json out.json]
"""
from __future__ import annotations

import argparse
import logging
import shlex
import sys

from tally.errors import TallyError
from tally.quality.settings import SUITES, VERDICTS, Decoding, EvalSettings, Thresholds
from tally.units import parse_bytes

EXIT_NO_GO = 1
EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tally eval", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    for who in ("baseline", "candidate"):
        p.add_argument(f"--{who}", default=None, help="checkpoint dir, .gguf file or alias (default: built-in model)")
        p.add_argument(f"--{who}-quantization", default=None, choices=["int8", "int4", "w8a8", "gguf"])
        p.add_argument(f"--{who}-kv-cache-dtype", default="auto", choices=["auto", "int8"],
                       help="int8: the KV cache in int8 (weights unchanged), to gate the KV quantization alone")
    p.add_argument("--candidate-corrupt", default=None, metavar="zero-layer:N",
                   help="damage the candidate on purpose, to check that the gate fails it")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"], help="both models")
    p.add_argument("--max-model-len", type=int, default=2048, help="both models; long-tail inputs fill it")
    p.add_argument("--kv-cache-memory", type=parse_bytes, default=None, help="bytes for each model's KV pool")
    p.add_argument("--suites", default=",".join(SUITES), help=f"comma-separated subset of {','.join(SUITES)}")
    p.add_argument("--ppl-tokens", type=int, default=4096, help="held-out tokens scored for perplexity")
    p.add_argument("--ppl-window", type=int, default=1024, help="tokens per perplexity window (≤ max-model-len)")
    p.add_argument("--max-tokens", type=int, default=64, help="greedy tokens per task / long-tail item")
    p.add_argument("--batch-size", type=int, default=32, help="requests decoded together (same for both)")
    p.add_argument("--limit", type=int, default=None, help="items per suite file (default: all)")
    p.add_argument("--thresholds", nargs="*", default=[], metavar="NAME=WARN,FAIL",
                   help="e.g. ppl=2,5 tasks=5,15 longtail=40,75 (losses: %% ppl up, points down, %% disagree)")
    p.add_argument("--fail-on", default="fail", choices=VERDICTS[1:], help="verdict from which the exit code is 1")
    p.add_argument("--json", default=None, metavar="PATH", help="write the report as JSON here")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--quiet", action="store_true", help="no progress lines or bars on stderr (bars show only on a "
                                                        "terminal)")
    return p


def main(argv: list[str]) -> int:
    ns = build_parser().parse_args(argv)
    logging.getLogger("tally.quality").setLevel(logging.WARNING if ns.quiet else logging.INFO)
    logging.basicConfig(format="tally eval: %(message)s")
    command = "tally eval " + shlex.join(argv)
    try:
        settings = EvalSettings(
            suites=tuple(s.strip() for s in ns.suites.split(",") if s.strip()),
            decoding=Decoding(max_tokens=ns.max_tokens, batch_size=ns.batch_size),
            thresholds=Thresholds.parse(ns.thresholds), ppl_tokens=ns.ppl_tokens, ppl_window_tokens=ns.ppl_window,
            limit=ns.limit)
        import torch

        from tally.quality.gate import run_gate
        from tally.quality.model_run import ModelSpec
        from tally.quality.report import print_table, write_json

        if ns.threads:
            torch.set_num_threads(ns.threads)
        common = dict(dtype=ns.dtype, max_model_len=ns.max_model_len, kv_cache_memory=ns.kv_cache_memory)
        baseline = ModelSpec(ns.baseline, ns.baseline_quantization, kv_cache_dtype=ns.baseline_kv_cache_dtype, **common)
        candidate = ModelSpec(ns.candidate, ns.candidate_quantization, kv_cache_dtype=ns.candidate_kv_cache_dtype,
                              corrupt=ns.candidate_corrupt, **common)
        report = run_gate(baseline, candidate, settings, fail_on=ns.fail_on, progress=not ns.quiet)
    except TallyError as exc:
        print(f"tally eval: {exc.message}", file=sys.stderr)
        return EXIT_USAGE
    print_table(report, command)
    if ns.json:
        write_json(report, ns.json, command)
    return 0 if report.go else EXIT_NO_GO
