"""The gate's report: one JSON document (for CI) and one table (for people), from the same GateReport."""
from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from tally.quality.gate import GateReport


def _threshold(report: GateReport, suite_name: str) -> dict[str, float]:
    return asdict(getattr(report.settings.thresholds, suite_name.split("/")[0]))


def to_json(report: GateReport, command: str) -> dict[str, Any]:
    return {
        "overall": report.overall,
        "go": report.go,
        "fail_on": report.fail_on,
        "baseline": {**asdict(report.baseline), "label": report.baseline.label()},
        "candidate": {**asdict(report.candidate), "label": report.candidate.label()},
        "settings": report.settings.to_dict(),
        "max_model_len": report.max_model_len,
        "suites": [{**asdict(r), "thresholds": _threshold(report, r.name)} for r in report.results],
        "worst_longtail": [asdict(w) for w in report.worst],
        "skipped_items": report.skipped,
        "timings_s": report.timings_s,
        "command": command,
    }


def json_text(report: GateReport, command: str) -> str:
    return json.dumps(to_json(report, command), indent=2, ensure_ascii=False) + "\n"


def _fmt(metric: str, value: float) -> str:
    return f"{value:.3f}" if metric == "perplexity" else f"{value * 100:.1f}%"


def _loss(name: str, loss: float) -> str:
    return f"{loss:+.1f} pts" if name.startswith("tasks") else f"{loss:+.2f}%"


def print_table(report: GateReport, command: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    if not console.is_terminal:  # CI logs: wide enough that the table does not wrap
        console = Console(highlight=False, width=110)
    d = report.settings.decoding
    table = Table(title=f"tally eval: {report.candidate.label()}  vs  baseline {report.baseline.label()}")
    for col in ("suite", "metric", "baseline", "candidate", "loss", "warn/fail", "verdict", "n"):
        table.add_column(col, justify="right" if col not in ("suite", "metric", "verdict") else "left")
    colour = {"pass": "green", "warn": "yellow", "fail": "red"}
    for r in report.results:
        t = _threshold(report, r.name)
        table.add_row(r.name, r.metric, _fmt(r.metric, r.baseline), _fmt(r.metric, r.candidate),
                      _loss(r.name, r.loss), f"{t['warn']:g} / {t['fail']:g}",
                      f"[{colour[r.verdict]}]{r.verdict}[/]", str(r.num_items))
    console.print(table)
    console.print("loss: ppl = % perplexity increase, tasks = score drop in points, longtail = % of output tokens "
                  "that disagree with the baseline (share before the first divergence)")
    console.print(f"decoding: greedy (temperature {d.temperature:g}), max_tokens {d.max_tokens}, batch size "
                  f"{d.batch_size}, max_model_len {report.max_model_len}, ppl tokens "
                  f"{report.settings.ppl_tokens} in windows of ≤ {report.settings.ppl_window_tokens}")
    if report.skipped:
        console.print(f"skipped (prompt + max_tokens > max_model_len): {', '.join(report.skipped)}")
    if report.worst:
        console.print("worst long-tail cases (token agreement, first divergence):")
        for w in report.worst:
            console.print(f"  {w.id} [{w.category}] {w.token_agreement:.0%} at token {w.first_divergence}\n"
                          f"    baseline:  {w.baseline_text!r}\n    candidate: {w.candidate_text!r}")
    t = report.timings_s
    console.print(f"time: baseline {t['baseline_load_s']:.0f} s load + {t['baseline_run_s']:.0f} s run, "
                  f"candidate {t['candidate_load_s']:.0f} s load + {t['candidate_run_s']:.0f} s run")
    verdict = "GO" if report.go else "NO-GO"
    console.print(f"overall: [{colour[report.overall]}]{report.overall}[/] → {verdict}   ({command})")
