"""Baseline run vs candidate run → one result per suite, each with its loss and verdict, and the worst
long-tail cases. Pure arithmetic on the two runs; nothing here touches a model."""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from statistics import mean

from tally.quality.model_run import ModelRun
from tally.quality.scoring import score, token_agreement
from tally.quality.settings import VERDICTS, EvalSettings
from tally.quality.suites import TASK_SUITES, Item

SNIPPET_CHARS = 160


@dataclass
class SuiteResult:
    name: str  # ppl | tasks/json | tasks/numbers | tasks/format | longtail
    metric: str  # what baseline and candidate hold
    baseline: float
    candidate: float
    loss: float  # the number the thresholds judge (larger is worse)
    loss_unit: str
    verdict: str
    num_items: int
    details: dict = field(default_factory=dict)


@dataclass
class WorstCase:
    id: str
    category: str | None
    token_agreement: float
    first_divergence: int | None  # output token index, None when identical
    baseline_text: str
    candidate_text: str


def perplexity(run: ModelRun) -> tuple[float, dict[str, float]]:
    """(over all held-out tokens, per held-out text)."""
    per_text = {name: math.exp(nll / max(1, n)) for name, (nll, n) in run.nll_by_text.items()}
    total_nll = sum(nll for nll, _ in run.nll_by_text.values())
    total_n = sum(n for _, n in run.nll_by_text.values())
    return math.exp(total_nll / max(1, total_n)), per_text


def compare_ppl(base: ModelRun, cand: ModelRun, settings: EvalSettings) -> SuiteResult:
    base_ppl, base_texts = perplexity(base)
    cand_ppl, cand_texts = perplexity(cand)
    loss_pct = (cand_ppl / base_ppl - 1.0) * 100.0
    details = {"tokens": sum(n for _, n in base.nll_by_text.values()),
               "per_text": {k: {"baseline": base_texts[k], "candidate": cand_texts[k]} for k in base_texts}}
    return SuiteResult("ppl", "perplexity", base_ppl, cand_ppl, loss_pct, "% ppl increase",
                       settings.thresholds.ppl.verdict(loss_pct), len(base.nll_by_text), details)


def _agreements(items: list[Item], base: ModelRun, cand: ModelRun) -> list[tuple[float, int | None]]:
    return [token_agreement(base.generations[it.id].token_ids, cand.generations[it.id].token_ids) for it in items]


def compare_task(suite: str, items: list[Item], base: ModelRun, cand: ModelRun,
                 settings: EvalSettings) -> SuiteResult:
    base_score = mean(score(base.generations[it.id].text, it.check) for it in items)
    cand_score = mean(score(cand.generations[it.id].text, it.check) for it in items)
    drop_pts = (base_score - cand_score) * 100.0
    agree = _agreements(items, base, cand)
    details = {"exact_match_with_baseline": mean(a == 1.0 for a, _ in agree),
               "token_agreement_with_baseline": mean(a for a, _ in agree)}
    return SuiteResult(f"tasks/{suite}", "score", base_score, cand_score, drop_pts, "pts score drop",
                       settings.thresholds.tasks.verdict(drop_pts), len(items), details)


def compare_longtail(items: list[Item], base: ModelRun, cand: ModelRun,
                     settings: EvalSettings) -> tuple[SuiteResult, list[WorstCase]]:
    agree = _agreements(items, base, cand)
    mean_agree = mean(a for a, _ in agree)
    by_category = defaultdict(list)
    for it, (a, _) in zip(items, agree):
        by_category[it.category].append(a)
    details = {"exact_match_with_baseline": mean(a == 1.0 for a, _ in agree),
               "token_agreement_by_category": {k: mean(v) for k, v in by_category.items()}}
    loss_pct = (1.0 - mean_agree) * 100.0
    result = SuiteResult("longtail", "agreement", 1.0, mean_agree, loss_pct, "% tokens disagree",
                         settings.thresholds.longtail.verdict(loss_pct), len(items), details)
    ranked = sorted(zip(items, agree), key=lambda x: x[1][0])
    worst = [WorstCase(it.id, it.category, a, first, base.generations[it.id].text[:SNIPPET_CHARS],
                       cand.generations[it.id].text[:SNIPPET_CHARS])
             for it, (a, first) in ranked[:settings.worst_cases] if a < 1.0]
    return result, worst


def compare_runs(items: list[Item], base: ModelRun, cand: ModelRun,
                 settings: EvalSettings) -> tuple[list[SuiteResult], list[WorstCase]]:
    results, worst = [], []
    if base.nll_by_text:
        results.append(compare_ppl(base, cand, settings))
    for suite in TASK_SUITES:
        chosen = [it for it in items if it.suite == suite]
        if chosen:
            results.append(compare_task(suite, chosen, base, cand, settings))
    longtail = [it for it in items if it.suite == "longtail"]
    if longtail:
        result, worst = compare_longtail(longtail, base, cand, settings)
        results.append(result)
    return results, worst


def overall_verdict(results: list[SuiteResult]) -> str:
    return max((r.verdict for r in results), key=VERDICTS.index, default="pass")
