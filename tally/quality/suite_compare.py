"""Scores per metric and tag, with bootstrap intervals: one model's mean, and for two models the paired change; then
the user's rules judged on them. Pure arithmetic on the results files' rows; nothing here touches a model."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from tally.quality.bootstrap import Interval, mean_ci, paired_diff_ci
from tally.quality.suite_file import SuiteFile
from tally.quality.suite_rules import BROKEN, HELD, TOO_FEW, SuiteRule, SuiteRules
from tally.quality.suite_run import ItemResult

TOLERANCE = 1e-9  # float noise of a mean is not a breach


@dataclass(frozen=True)
class GroupResult:
    metric: str
    tag: str
    n: int
    baseline: Interval  # the mean score (the only model's, when one runs)
    candidate: Interval | None
    change: Interval | None  # candidate − baseline, paired by item


@dataclass(frozen=True)
class RuleVerdict:
    rule: SuiteRule
    verdict: str  # HELD, BROKEN or TOO_FEW
    judged: float | None  # the drop or the score the threshold was held against
    n: int

    def explain(self, decide: str, confidence: float) -> str:
        r = self.rule
        if self.verdict == TOO_FEW:
            return f"{r.name}: {self.n} items, fewer than min_items: too few to judge"
        on = f"the {confidence:.0%} interval's worse end" if decide == "ci" else "the mean"
        if r.kind == "max_drop":
            sign = "≤" if self.verdict == HELD else ">"
            return f"{r.name}: drop {self.judged * 100:.1f} pts ({on}) {sign} max_drop {r.threshold * 100:g} pts"
        sign = "≥" if self.verdict == HELD else "<"
        return f"{r.name}: score {self.judged:.1%} ({on}) {sign} min_score {r.threshold:.1%}"


def suite_metrics(suites: list[SuiteFile]) -> tuple[set[str], set[str]]:
    """The metrics and tags the suites' items will be reported under, known before any model runs."""
    metrics, tags = {"all"}, {"all"}
    for item in (it for s in suites for it in s.items):
        metrics.add(item.kind)
        if item.kind == "json_fields":
            metrics |= {f"json_fields.{name}" for name in item.scorer_spec["fields"]}
        tags.update(item.tags)
    return metrics, tags


def _groups(results: list[ItemResult]) -> dict[tuple[str, str], list[int]]:
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, r in enumerate(results):
        for metric in r.metrics:
            for tag in ("all", *r.tags):
                groups[(metric, tag)].append(i)
    # `all` first, then the scorers, then the fields; within a metric, every item first, then each tag.
    return dict(sorted(groups.items(), key=lambda kv: (kv[0][0] != "all", "." in kv[0][0], kv[0][0],
                                                        kv[0][1] != "all", kv[0][1])))


def group_results(baseline: list[ItemResult], candidate: list[ItemResult] | None,
                  confidence: float) -> list[GroupResult]:
    if candidate is not None and [r.key for r in baseline] != [r.key for r in candidate]:
        raise ValueError("baseline and candidate results are not of the same items")
    out = []
    for (metric, tag), rows in _groups(baseline).items():
        base = np.array([baseline[i].metrics[metric] for i in rows])
        cand = np.array([candidate[i].metrics[metric] for i in rows]) if candidate is not None else None
        out.append(GroupResult(metric, tag, len(rows), mean_ci(base, confidence),
                               None if cand is None else mean_ci(cand, confidence),
                               None if cand is None else paired_diff_ci(base, cand, confidence)))
    return out


def judge(rules: SuiteRules, groups: list[GroupResult]) -> list[RuleVerdict]:
    by_key = {(g.metric, g.tag): g for g in groups}
    verdicts = []
    for rule in rules.rules:
        g = by_key[(rule.metric, rule.tag)]
        if g.n < rules.min_items:
            verdicts.append(RuleVerdict(rule, TOO_FEW, None, g.n))
            continue
        if rule.kind == "max_drop":
            change = g.change
            judged = 0.0 - (change.low if rules.decide == "ci" else change.estimate)  # 0.0 -: no "-0.0" shown
            broken = judged > rule.threshold + TOLERANCE
        else:
            score = g.candidate or g.baseline
            judged = score.low if rules.decide == "ci" else score.estimate
            broken = judged < rule.threshold - TOLERANCE
        verdicts.append(RuleVerdict(rule, BROKEN if broken else HELD, judged, g.n))
    return verdicts
