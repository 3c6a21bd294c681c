"""A user-suite eval's report: one JSON document (for CI) and one table (for people), from the same SuiteReport."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from tally.quality.bootstrap import RESAMPLES, SEED
from tally.quality.suite_compare import GroupResult, RuleVerdict
from tally.quality.suite_rules import HELD, SuiteRules
from tally.quality.suite_run import ItemResult

WORST_ITEMS = 5
SNIPPET_CHARS = 120


@dataclass(frozen=True)
class SuiteReport:
    models: dict[str, dict[str, Any]]  # "baseline" (and "candidate") -> as its results file records it
    suites: list[dict[str, Any]]
    results_files: dict[str, str]
    groups: list[GroupResult]
    rules: SuiteRules | None
    verdicts: list[RuleVerdict]
    worst: list[dict[str, Any]]
    confidence: float

    @property
    def go(self) -> bool | None:
        """None when no rule was given: scores, no verdict."""
        return None if self.rules is None else all(v.verdict == HELD for v in self.verdicts)


def worst_items(baseline: list[ItemResult], candidate: list[ItemResult] | None) -> list[dict[str, Any]]:
    """The items the candidate lost most on (one model: the items it failed), with both answers and reasons."""
    if candidate is None:
        lost = [(r.score - 1.0, r, None) for r in baseline if r.score < 1.0]
    else:
        lost = [(c.score - b.score, b, c) for b, c in zip(baseline, candidate) if c.score < b.score]
    lost.sort(key=lambda x: x[0])
    out = []
    for change, b, c in lost[:WORST_ITEMS]:
        row = {"key": b.key, "line": b.line, "tags": list(b.tags), "scorer": b.scorer, "change": change,
               "baseline": {"score": b.score, "reason": b.reason, "answer": b.answer[:SNIPPET_CHARS]}}
        if c is not None:
            row["candidate"] = {"score": c.score, "reason": c.reason, "answer": c.answer[:SNIPPET_CHARS]}
        out.append(row)
    return out


def to_json(report: SuiteReport, command: str) -> dict[str, Any]:
    decide = report.rules.decide if report.rules else None
    return {
        "go": report.go,
        "models": report.models,
        "suites": report.suites,
        "results_files": report.results_files,
        "bootstrap": {"method": "percentile, paired by item", "resamples": RESAMPLES, "seed": SEED,
                      "confidence": report.confidence},
        "groups": [asdict(g) for g in report.groups],
        "rules": None if report.rules is None else {
            "decide": decide, "min_items": report.rules.min_items, "confidence": report.rules.confidence,
            "verdicts": [{**asdict(v.rule), "verdict": v.verdict, "judged": v.judged, "n": v.n,
                          "explain": v.explain(decide, report.rules.confidence)} for v in report.verdicts]},
        "worst_items": report.worst,
        "command": command,
    }


def json_text(report: SuiteReport, command: str) -> str:
    return json.dumps(to_json(report, command), indent=2, ensure_ascii=False) + "\n"


def _pct(x: float) -> str:
    return f"{x * 100:.1f}"


def print_table(report: SuiteReport, command: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    if not console.is_terminal:  # CI logs: wide enough that the table does not wrap
        console = Console(highlight=False, width=130)
    two = "candidate" in report.models
    title = " vs ".join(f"{side} {m['label']}" for side, m in report.models.items())
    table = Table(title=f"tally eval --suite: {title}")
    ci = f"{report.confidence:.0%} CI"
    cols = ["metric", "tag", "n", "baseline %" if two else "score %", ci]
    cols += ["candidate %", ci, "change pts", f"change {ci}"] if two else []
    for col in cols:
        table.add_column(col, justify="left" if col in ("metric", "tag") else "right")
    everything = {g.metric: g.n for g in report.groups if g.tag == "all"}
    for g in report.groups:
        if g.tag != "all" and g.n == everything[g.metric]:
            continue  # a tag every item of the metric has: the same row as "all" (the JSON keeps it)
        row = [g.metric, g.tag, str(g.n), _pct(g.baseline.estimate),
               f"{_pct(g.baseline.low)}–{_pct(g.baseline.high)}"]
        if two:
            row += [_pct(g.candidate.estimate), f"{_pct(g.candidate.low)}–{_pct(g.candidate.high)}",
                    f"{g.change.estimate * 100:+.1f}", f"{g.change.low * 100:+.1f} … {g.change.high * 100:+.1f}"]
        table.add_row(*row)
    console.print(table)
    for side, model in report.models.items():
        console.print(f"{side} results: {report.results_files[side]}")
    for suite in report.suites:
        d = suite["decoding"]
        how = "greedy" if d["temperature"] == 0 else f"temperature {d['temperature']:g}, top_p {d['top_p']:g}, " \
                                                    f"seed {d['seed']}"
        console.print(f"suite {suite['path']} ({suite['items']} items, sha256 {suite['sha256'][:12]}): {how}, "
                      f"max_tokens {d['max_tokens']}")
    for w in report.worst:
        side = w.get("candidate", w["baseline"])
        console.print(f"  lost {w['key']} (line {w['line']}, {w['scorer']}): {side['reason'] or ''}  "
                      f"answer {side['answer']!r}")
    if report.rules is None:
        console.print(f"no --rules: scores only, no verdict   ({command})")
        return
    for v in report.verdicts:
        mark = "[green]held[/]" if v.verdict == HELD else f"[red]{v.verdict}[/]"
        console.print(f"  {mark}  {v.explain(report.rules.decide, report.rules.confidence)}")
    verdict = "[green]GO[/]" if report.go else "[red]NO-GO[/]"
    console.print(f"overall: {verdict}   ({command})")
