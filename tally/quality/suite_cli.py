"""`tally eval --suite FILE.jsonl`: the user's own tasks, on one model or two (each a local model or a server's URL),
scored per metric and tag; with two, the paired change and a GO/NO-GO against the user's --rules.

Everything that can be wrong with the suites or the rules is found before a model loads; each model's results are
written item by item, so Ctrl-C or a crash keeps them and `--resume` goes on."""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from tally.errors import ConfigError, TallyError
from tally.quality.answers import AnswerSource
from tally.quality.answers_url import UrlAnswers, is_url
from tally.quality.report_output import write_report
from tally.quality.suite_compare import group_results, judge, suite_metrics
from tally.quality.suite_file import SuiteFile, read_suites
from tally.quality.suite_report import SuiteReport, json_text, print_table, worst_items
from tally.quality.suite_rules import DEFAULT_CONFIDENCE, SuiteRules, check_against, load_rules
from tally.quality.suite_run import ItemResult, RunFile, header, run_suites

log = logging.getLogger("tally.quality")
EXIT_INTERRUPTED = 130


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suite", type=Path, action="append", default=[], metavar="FILE.jsonl",
                   help="a suite of your own tasks (repeatable); with it, --baseline/--candidate may be URLs")
    p.add_argument("--rules", type=Path, default=None, metavar="FILE.yaml",
                   help="--suite: the thresholds GO/NO-GO is judged on (needed to compare two models)")
    p.add_argument("--results", type=Path, default=Path("tally-eval-results"), metavar="DIR",
                   help="--suite: where each model's results are written, item by item (default: %(default)s)")
    p.add_argument("--resume", action="store_true",
                   help="--suite: keep the items already in --results for the same model and suites, run the rest")
    for who in ("baseline", "candidate"):
        p.add_argument(f"--{who}-model", default=None, metavar="NAME",
                       help=f"--suite with a URL as --{who}: the served model's name (default: the first listed)")


GATE_ONLY = ("suites", "ppl_tokens", "ppl_window", "limit", "thresholds", "fail_on")  # the shipped suites' options
SUITE_ONLY = ("rules", "results", "resume", "baseline_model", "candidate_model")


def check_options(ns: argparse.Namespace, defaults: argparse.Namespace) -> None:
    """Options of one mode given in the other are refused by name, never ignored."""
    wrong = GATE_ONLY if ns.suite else SUITE_ONLY
    given = [name for name in wrong if getattr(ns, name) != getattr(defaults, name)]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise ConfigError(f"{flags}: an option of the shipped suites' gate; with --suite, thresholds go in --rules"
                          if ns.suite else f"{flags}: an option of --suite (your own suites); add --suite FILE.jsonl")


def has_candidate(ns: argparse.Namespace) -> bool:
    return bool(ns.candidate or ns.candidate_quantization or ns.candidate_corrupt
                or ns.candidate_kv_cache_dtype != "auto")


def _source(ns: argparse.Namespace, who: str) -> AnswerSource:
    model = getattr(ns, who)
    if is_url(model):
        return UrlAnswers(model, getattr(ns, f"{who}_model"), ns.batch_size)
    from tally.quality.answers_local import LocalAnswers  # torch and the engine: only for a local model
    from tally.quality.model_run import ModelSpec

    spec = ModelSpec(model, getattr(ns, f"{who}_quantization"), dtype=ns.dtype, max_model_len=ns.max_model_len,
                     kv_cache_memory=ns.kv_cache_memory, kv_cache_dtype=getattr(ns, f"{who}_kv_cache_dtype"),
                     corrupt=getattr(ns, f"{who}_corrupt", None), threads=ns.threads)
    return LocalAnswers(spec, ns.batch_size, progress=not ns.quiet)


def _run(ns: argparse.Namespace, who: str, suites: list[SuiteFile]) -> tuple[list[ItemResult], dict[str, Any], Path]:
    source = _source(ns, who)
    path = ns.results / f"{who}.jsonl"
    run_file = RunFile(path, header(source, suites), ns.resume)
    try:
        results = run_suites(source, suites, run_file, ns.batch_size, who)
    except KeyboardInterrupt:
        log.warning("interrupted: %s's results so far (items scored: %d) are in %s; run the same command with "
                    "--resume to go on", who, len(run_file.done), path)
        raise
    except ConfigError as e:
        raise ConfigError(f"{e.message} ({who}'s results so far, items scored: {len(run_file.done)}, are in {path}; "
                          "--resume goes on)") from None
    finally:
        run_file.close()
    return results, source.describe(), path


def _check(ns: argparse.Namespace, suites: list[SuiteFile], two: bool) -> SuiteRules | None:
    if ns.rules is None:
        if two:
            raise ConfigError("comparing two models needs --rules FILE.yaml: the thresholds GO/NO-GO is judged on, "
                              "written before the eval runs (docs/quality.md has an example)")
        return None
    rules = load_rules(ns.rules)
    check_against(rules, *suite_metrics(suites), two, str(ns.rules))
    return rules


def run(ns: argparse.Namespace) -> SuiteReport:
    """Raises ConfigError (bad suite, rules, URL: before any model runs where it can) and KeyboardInterrupt."""
    if ns.batch_size < 1:
        raise ConfigError(f"--batch-size must be ≥ 1, got {ns.batch_size}")
    suites = read_suites(ns.suite, ns.max_tokens)
    two = has_candidate(ns)
    rules = _check(ns, suites, two)
    sides = ("baseline", "candidate") if two else ("baseline",)
    results, models, files = {}, {}, {}
    for who in sides:
        results[who], models[who], path = _run(ns, who, suites)
        files[who] = str(path)
    confidence = rules.confidence if rules else DEFAULT_CONFIDENCE
    groups = group_results(results["baseline"], results.get("candidate"), confidence)
    verdicts = judge(rules, groups) if rules else []
    return SuiteReport(models, [s.describe() for s in suites], files, groups, rules, verdicts,
                       worst_items(results["baseline"], results.get("candidate")), confidence)


def main(ns: argparse.Namespace, command: str, exit_usage: int, exit_no_go: int) -> int:
    try:
        report = run(ns)
    except TallyError as exc:
        print(f"tally eval: {exc.message}", file=sys.stderr)
        return exit_usage
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    write_report(report, ns, command, json_text, print_table)
    return exit_no_go if report.go is False else 0
