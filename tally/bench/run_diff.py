"""`tally bench compare A.json B.json`: the two runs side by side, the change of each figure,
and a flag on every change for the worse beyond the threshold (exit status 1 if any)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tally.bench.report_json import load_result
from tally.flags import parser
from tally.units import format_s, parse_fraction


@dataclass(frozen=True)
class Figure:
    label: str
    path: tuple[str, ...]  # keys into the result's summary
    higher_is_worse: bool
    seconds: bool = True


FIGURES = (
    Figure("TTFT P50", ("ttft_s", "p50"), True), Figure("TTFT P99", ("ttft_s", "p99"), True),
    Figure("TPOT P50", ("tpot_s", "p50"), True), Figure("TPOT P99", ("tpot_s", "p99"), True),
    Figure("ITL P99", ("itl_s", "p99"), True),
    Figure("E2E P50", ("e2e_s", "p50"), True), Figure("E2E P99", ("e2e_s", "p99"), True),
    Figure("requests/s", ("throughput", "requests_per_s"), False, False),
    Figure("output tokens/s", ("throughput", "output_tokens_per_s"), False, False),
    Figure("goodput req/s", ("goodput", "requests_per_s"), False, False),
    Figure("failed fraction", ("failed_fraction",), True, False),
)


def _value(summary: dict, path: tuple[str, ...]) -> float | None:
    if path == ("failed_fraction",):
        counts = summary["counts"]
        return counts["failed"] / counts["requests"] if counts["requests"] else None
    node: object = summary
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return node if isinstance(node, (int, float)) else None


def compare(a: dict, b: dict, threshold: float) -> list[dict]:
    """One row per figure both runs have: values, relative change, regression flag."""
    rows = []
    for figure in FIGURES:
        va, vb = _value(a["summary"], figure.path), _value(b["summary"], figure.path)
        if va is None or vb is None:
            continue
        change = (vb - va) / abs(va) if va else (0.0 if vb == va else float("inf"))
        worse = change if figure.higher_is_worse else -change
        rows.append({"figure": figure.label, "a": va, "b": vb, "change": change,
                     "regression": worse > threshold, "seconds": figure.seconds})
    return rows


def _workload_differences(a: dict, b: dict) -> list[str]:
    wa, wb = a.get("workload", {}), b.get("workload", {})
    return sorted(k for k in set(wa) | set(wb) if wa.get(k) != wb.get(k))


def build_parser() -> argparse.ArgumentParser:
    p = parser("tally bench compare", __doc__)
    p.add_argument("a", type=Path, help="baseline result (tally bench --out)")
    p.add_argument("b", type=Path, help="candidate result")
    p.add_argument("--threshold", default="10%", help="flag changes for the worse beyond this")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    a, b = load_result(args.a), load_result(args.b)
    threshold = parse_fraction(args.threshold, "--threshold")
    rows = compare(a, b, threshold)
    table = Table(title=f"A = {args.a}   B = {args.b}   (regression: worse by > {threshold:.0%})",
                  title_justify="left")
    for column in ("figure", "A", "B", "change", ""):
        table.add_column(column, justify="left" if column in ("figure", "") else "right")
    for row in rows:
        show = format_s if row["seconds"] else (lambda v: f"{v:.4g}")
        table.add_row(row["figure"], show(row["a"]), show(row["b"]), f"{row['change']:+.1%}",
                      "[red]REGRESSION[/]" if row["regression"] else "")
    console = Console()
    console.print(table)
    differences = _workload_differences(a, b)
    if differences:
        console.print(f"[yellow]note:[/] the workloads differ in {', '.join(differences)}; the comparison "
                      f"mixes workload and server changes")
    for name, result in (("A", a), ("B", b)):
        if result.get("partial"):
            console.print(f"[yellow]note:[/] {name} is a partial run ({result['stopped']['detail']} at "
                          f"{result['stopped']['at_s']:.1f}s): its figures cover only what finished")
    regressions = [r["figure"] for r in rows if r["regression"]]
    console.print(f"{len(regressions)} regression(s){': ' + ', '.join(regressions) if regressions else ''}")
    return 1 if regressions else 0
