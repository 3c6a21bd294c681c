"""The rules a canary must keep, and the figures they read: the responses each side gave in one window.

A rules file (YAML), validated by hand here because jsonschema is not in the `ops` extra:

    min_samples: 20        # per side and per figure in the window; with fewer the step holds (no verdict)
    window: 5m             # evaluations read the responses that finished in the last 5m of the current step
    rules:
      - {metric: ttft_p99, max_ratio: 1.5}             # canary P99 ≤ 1.5 × stable P99
      - {metric: tpot_p99, max_ratio: 1.5}
      - {metric: error_rate, max_increase: 1%}         # canary ≤ stable + 1 percentage point
      - {metric: mean_output_tokens, min_ratio: 0.8}   # a model that truncates looks fast
      - {metric: length_share, max_increase: 5%}       # share of choices with finish_reason=length
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from tally.errors import ConfigError
from tally.units import parse_duration_s, parse_fraction

DEFAULT_MIN_SAMPLES = 20
DEFAULT_WINDOW_S = 300.0
HELD, BROKEN, TOO_FEW = "held", "broken", "too_few_samples"


@dataclass(frozen=True)
class Metric:
    figure: str  # the SideFigures field compared
    samples: str  # the SideFigures field counting the values behind it
    threshold: str  # the one key a rule on this metric takes


METRICS = {
    "ttft_p99": Metric("ttft_p99_s", "ttft_samples", "max_ratio"),
    "tpot_p99": Metric("tpot_p99_s", "tpot_samples", "max_ratio"),
    "error_rate": Metric("error_rate", "requests", "max_increase"),
    "mean_output_tokens": Metric("mean_output_tokens", "output_samples", "min_ratio"),
    "length_share": Metric("length_share", "finished_choices", "max_increase"),
}
MEANING = {"max_ratio": "canary ≤ max_ratio × stable", "min_ratio": "canary ≥ min_ratio × stable",
           "max_increase": "canary ≤ stable + max_increase (a fraction or N%)"}


@dataclass(frozen=True)
class Rule:
    metric: str  # a key of METRICS
    threshold: float

    @property
    def kind(self) -> str:
        return METRICS[self.metric].threshold

    def limit(self, stable: float) -> float:
        return stable + self.threshold if self.kind == "max_increase" else stable * self.threshold

    def breaks(self, canary: float, stable: float) -> bool:
        limit = self.limit(stable)
        return canary < limit if self.kind == "min_ratio" else canary > limit


@dataclass(frozen=True)
class CanaryRules:
    rules: tuple[Rule, ...]
    min_samples: int = DEFAULT_MIN_SAMPLES
    window_s: float = DEFAULT_WINDOW_S


def _threshold(kind: str, value: object, where: str) -> float:
    if isinstance(value, str) and kind == "max_increase":
        number = parse_fraction(value, f"{where} {kind}")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    else:
        raise ConfigError(f"{where}: {kind} must be a number, got {value!r}")
    if not math.isfinite(number) or number < 0 or (kind != "max_increase" and number == 0):
        raise ConfigError(f"{where}: {kind} {value!r} is out of range ({MEANING[kind]})")
    if kind == "max_increase" and number > 1:
        raise ConfigError(f"{where}: max_increase {value!r} is over 100%; write a fraction (0.01) or 1%")
    return number


def _rule(item: object, where: str) -> Rule:
    if not isinstance(item, dict) or not isinstance(item.get("metric"), str):
        raise ConfigError(f"{where} must be a mapping with a metric, e.g. {{metric: ttft_p99, max_ratio: 1.5}}")
    metric = METRICS.get(item["metric"])
    if metric is None:
        raise ConfigError(f"{where}: unknown metric {item['metric']!r}; use one of {', '.join(METRICS)}")
    where = f"{where} ({item['metric']})"
    keys = set(item) - {"metric"}
    if keys != {metric.threshold}:
        raise ConfigError(f"{where} takes exactly one threshold, {metric.threshold} "
                          f"({MEANING[metric.threshold]}); got {sorted(keys) or 'none'}")
    return Rule(item["metric"], _threshold(metric.threshold, item[metric.threshold], where))


def parse_rules(data: object, source: str) -> CanaryRules:
    """A rules file's parsed YAML → CanaryRules; `source` names the file in every message."""
    if not isinstance(data, dict):
        raise ConfigError(f"--rules {source}: expected a mapping with a `rules:` list; see docs/operations.md")
    unknown = sorted(set(data) - {"rules", "min_samples", "window"})
    if unknown:
        raise ConfigError(f"--rules {source}: unknown key(s) {unknown}; known: rules, min_samples, window")
    items = data.get("rules")
    if not isinstance(items, list) or not items:
        raise ConfigError(f"--rules {source}: needs at least one rule under `rules:` — the rollback rules are the "
                          "point of a canary")
    rules = tuple(_rule(item, f"--rules {source} rule {i}") for i, item in enumerate(items, 1))
    min_samples = data.get("min_samples", DEFAULT_MIN_SAMPLES)
    if isinstance(min_samples, bool) or not isinstance(min_samples, int) or min_samples < 1:
        raise ConfigError(f"--rules {source}: min_samples must be a whole number ≥ 1, got {min_samples!r}")
    window_s = parse_duration_s(data.get("window", DEFAULT_WINDOW_S), f"--rules {source} window")
    if window_s <= 0:
        raise ConfigError(f"--rules {source}: window must be above 0 s")
    return CanaryRules(rules, min_samples, window_s)


def load_rules(path: Path) -> CanaryRules:
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"--rules {path}: cannot read it ({e.strerror}); write the rollback rules first "
                          "(docs/operations.md has an example)") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"--rules {path} is not valid YAML: {e}") from None
    return parse_rules(data, str(path))


@dataclass(frozen=True)
class Sample:
    """One response from one backend, as the proxy saw it (tally/ops/response_meter.py)."""

    end_s: float  # monotonic
    error: bool  # 5xx, 429, unreachable, a broken stream or an error event in it
    ttft_s: float | None = None  # streamed responses only
    tpot_s: float | None = None
    output_tokens: int | None = None
    finish_reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class SideFigures:
    requests: int
    errors: int
    error_rate: float | None
    ttft_samples: int
    ttft_p99_s: float | None
    tpot_samples: int
    tpot_p99_s: float | None
    output_samples: int
    mean_output_tokens: float | None
    finished_choices: int
    length_share: float | None


def _p99(values: list[float]) -> float | None:
    return float(np.percentile(values, 99)) if values else None


def figures(samples: Iterable[Sample]) -> SideFigures:
    samples = list(samples)
    ok = [s for s in samples if not s.error]
    errors = len(samples) - len(ok)
    ttft = [s.ttft_s for s in ok if s.ttft_s is not None]
    tpot = [s.tpot_s for s in ok if s.tpot_s is not None]
    tokens = [s.output_tokens for s in ok if s.output_tokens is not None]
    reasons = [r for s in ok for r in s.finish_reasons]
    return SideFigures(
        requests=len(samples), errors=errors, error_rate=errors / len(samples) if samples else None,
        ttft_samples=len(ttft), ttft_p99_s=_p99(ttft), tpot_samples=len(tpot), tpot_p99_s=_p99(tpot),
        output_samples=len(tokens), mean_output_tokens=sum(tokens) / len(tokens) if tokens else None,
        finished_choices=len(reasons),
        length_share=sum(r == "length" for r in reasons) / len(reasons) if reasons else None)


@dataclass(frozen=True)
class RuleVerdict:
    rule: Rule
    verdict: str  # HELD, BROKEN or TOO_FEW
    canary: float | None
    stable: float | None
    limit: float | None
    canary_samples: int
    stable_samples: int

    def explain(self) -> str:
        name, kind = self.rule.metric, self.rule.kind
        if self.verdict == TOO_FEW:
            return (f"{name}: {self.canary_samples} canary and {self.stable_samples} stable values in the window, "
                    f"fewer than min_samples")
        broken = self.verdict == BROKEN
        sign = ("<" if broken else "≥") if kind == "min_ratio" else (">" if broken else "≤")
        return (f"{name}: canary {self.canary:.4g} {sign} limit {self.limit:.4g} "
                f"({kind} {self.rule.threshold:g}, stable {self.stable:.4g})")


def judge(rules: CanaryRules, canary: SideFigures, stable: SideFigures) -> list[RuleVerdict]:
    """Every rule on the same window: held, broken, or too few values on one side to say."""
    verdicts = []
    for rule in rules.rules:
        metric = METRICS[rule.metric]
        c, s = getattr(canary, metric.figure), getattr(stable, metric.figure)
        nc, ns = getattr(canary, metric.samples), getattr(stable, metric.samples)
        if min(nc, ns) < rules.min_samples or c is None or s is None:
            verdicts.append(RuleVerdict(rule, TOO_FEW, c, s, None, nc, ns))
        else:
            verdicts.append(RuleVerdict(rule, BROKEN if rule.breaks(c, s) else HELD, c, s, rule.limit(s), nc, ns))
    return verdicts
