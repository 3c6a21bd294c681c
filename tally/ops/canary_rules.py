"""The rules a canary must keep, and the figures they read: each side's responses in one window, as the proxy saw
them, and — as a second source — each side's backends' own `/metrics` over the same window
(tally/ops/backend_metrics.py)."""
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
HELD, BROKEN, TOO_FEW, NO_DATA = "held", "broken", "too_few_samples", "no_data"
PROXY, BACKEND = "proxy", "backend"
SOURCES = (PROXY, BACKEND)


@dataclass(frozen=True)
class Metric:
    figure: str  # the SideFigures field compared
    samples: str  # the SideFigures field counting the values behind it
    threshold: str  # the one key a rule on this metric takes
    default_min_delta_s: float | None = None  # latency rules: the floor when the rule names none


METRICS = {
    "ttft_p99": Metric("ttft_p99_s", "ttft_samples", "max_ratio", 0.010),
    "tpot_p99": Metric("tpot_p99_s", "tpot_samples", "max_ratio", 0.002),
    "error_rate": Metric("error_rate", "requests", "max_increase"),
    "mean_output_tokens": Metric("mean_output_tokens", "output_samples", "min_ratio"),
    "length_share": Metric("length_share", "finished_choices", "max_increase"),
}
LATENCY = tuple(name for name, m in METRICS.items() if m.default_min_delta_s is not None)
MEANING = {"max_ratio": "canary ≤ max_ratio × stable", "min_ratio": "canary ≥ min_ratio × stable",
           "max_increase": "canary ≤ stable + max_increase (a fraction or N%)"}
KEYS = ("metric", "source", "min_delta_ms")  # besides each metric's threshold key


@dataclass(frozen=True)
class Rule:
    metric: str  # a key of METRICS
    threshold: float
    source: str = PROXY  # PROXY or BACKEND
    min_delta_s: float | None = None  # latency rules; None: the metric's default

    @property
    def kind(self) -> str:
        return METRICS[self.metric].threshold

    @property
    def floor_s(self) -> float | None:
        """How much worse than stable a latency figure may be, whatever the ratio says; None for other rules."""
        return self.min_delta_s if self.min_delta_s is not None else METRICS[self.metric].default_min_delta_s

    @property
    def name(self) -> str:
        return self.metric if self.source == PROXY else f"{self.metric} ({self.source})"

    def limit(self, stable: float) -> float:
        if self.kind == "max_increase":
            return stable + self.threshold
        ratio = stable * self.threshold
        # Worse by the ratio AND by more than the floor: breaks above the larger of the two limits.
        return max(ratio, stable + self.floor_s) if self.floor_s is not None else ratio

    def breaks(self, canary: float, stable: float) -> bool:
        limit = self.limit(stable)
        return canary < limit if self.kind == "min_ratio" else canary > limit

    def describe(self) -> dict:
        """The rule as the audit log writes it."""
        out = {"metric": self.metric, "source": self.source, self.kind: self.threshold}
        if self.floor_s is not None:
            out["min_delta_ms"] = round(self.floor_s * 1000, 6)
        return out


@dataclass(frozen=True)
class CanaryRules:
    """A rules file (YAML), validated by hand here because jsonschema is not in the `ops` extra:

        min_samples: 20        # per side and per figure in the window; with fewer the step holds (no verdict)
        window: 5m             # evaluations read the responses that finished in the last 5m of the current step
        rules:
          - {metric: ttft_p99, max_ratio: 1.5}             # canary P99 ≤ 1.5 × stable P99, or within 10 ms of it
          - {metric: tpot_p99, max_ratio: 1.5, min_delta_ms: 5}   # ... or within 5 ms of it
          - {metric: error_rate, max_increase: 1%}         # canary ≤ stable + 1 percentage point
          - {metric: mean_output_tokens, min_ratio: 0.8}   # a model that truncates looks fast
          - {metric: length_share, max_increase: 5%}       # share of choices with finish_reason=length
          - {metric: ttft_p99, max_ratio: 1.5, source: backend}   # the same, from the backends' /metrics

    `source` is `proxy` (the default: what the proxy measured of each response it passed on) or `backend` (each
    side's backends' own `/metrics`, when they are Tally or vLLM servers); to judge a signal on both, write the rule
    twice. A backend rule with nothing to read (a plain OpenAI server without `/metrics`, a vLLM without an error
    counter) is `no_data`, and the step holds as it does for too few samples: it never advances unjudged.

    `min_delta_ms` (latency rules only) is an absolute floor: a latency rule breaks only when the canary is worse than
    stable by the ratio AND by more than the floor, so 3 ms against 2 ms is not a regression. Defaults: 10 ms for
    ttft_p99, 2 ms for tpot_p99; `min_delta_ms: 0` turns the floor off."""
    rules: tuple[Rule, ...]
    min_samples: int = DEFAULT_MIN_SAMPLES
    window_s: float = DEFAULT_WINDOW_S

    @property
    def reads_backends(self) -> bool:
        return any(r.source == BACKEND for r in self.rules)


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


def _min_delta_s(metric: str, value: object, where: str) -> float:
    if metric not in LATENCY:
        raise ConfigError(f"{where}: min_delta_ms is a latency rule's floor ({', '.join(LATENCY)}); "
                          f"{metric} takes none")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{where}: min_delta_ms must be a number of milliseconds ≥ 0 (e.g. 10; 0 turns the "
                          f"floor off), got {value!r}")
    return float(value) / 1000


def _rule(item: object, where: str) -> Rule:
    if not isinstance(item, dict) or not isinstance(item.get("metric"), str):
        raise ConfigError(f"{where} must be a mapping with a metric, e.g. {{metric: ttft_p99, max_ratio: 1.5}}")
    metric = METRICS.get(item["metric"])
    if metric is None:
        raise ConfigError(f"{where}: unknown metric {item['metric']!r}; use one of {', '.join(METRICS)}")
    where = f"{where} ({item['metric']})"
    source = item.get("source", PROXY)
    if source not in SOURCES:
        raise ConfigError(f"{where}: source {source!r} is not one of {', '.join(SOURCES)} (proxy: what the proxy "
                          "measured of each response, the default; backend: each backend's own /metrics)")
    thresholds = set(item) - set(KEYS)
    if thresholds != {metric.threshold}:
        raise ConfigError(f"{where} takes exactly one threshold, {metric.threshold} "
                          f"({MEANING[metric.threshold]}); got {sorted(thresholds) or 'none'}")
    min_delta_s = _min_delta_s(item["metric"], item["min_delta_ms"], where) if "min_delta_ms" in item else None
    return Rule(item["metric"], _threshold(metric.threshold, item[metric.threshold], where), source, min_delta_s)


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


@dataclass(frozen=True)
class BackendFigures(SideFigures):
    """A side's figures from its backends' own /metrics over the window (tally/ops/backend_metrics.py): the same
    fields, counted per request where the proxy counts per choice (finished_choices: requests that finished with
    a reason other than abort), plus what only the server knows."""

    window_s: float  # between the first and the last scrape that bound the window
    prefix: str  # "tally:" or "vllm:" (or both, joined by "+", across a side's replicas)
    replicas: tuple[str, ...]  # the side's backends whose /metrics were read at both ends of the window
    missing: dict[str, str]  # the side's other backends, and why each could not be read
    unexposed: tuple[str, ...]  # SideFigures fields these servers do not expose (e.g. error_rate on a vLLM)
    preemptions: float | None  # recorded, not judged: they follow each side's load, which differs by design
    kv_usage: float | None  # at the window's end, the mean over the side's backends


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
    verdict: str  # HELD, BROKEN, TOO_FEW or NO_DATA
    canary: float | None
    stable: float | None
    limit: float | None
    canary_samples: int
    stable_samples: int
    no_data: str | None = None  # NO_DATA: why there was nothing to read

    def explain(self) -> str:
        name, kind = self.rule.name, self.rule.kind
        if self.verdict == NO_DATA:
            return f"{name}: no data ({self.no_data})"
        if self.verdict == TOO_FEW:
            return (f"{name}: {self.canary_samples} canary and {self.stable_samples} stable values in the window, "
                    f"fewer than min_samples")
        broken = self.verdict == BROKEN
        sign = ("<" if broken else "≥") if kind == "min_ratio" else (">" if broken else "≤")
        floor = f", min_delta {self.rule.floor_s * 1000:g} ms" if self.rule.floor_s is not None else ""
        return (f"{name}: canary {self.canary:.4g} {sign} limit {self.limit:.4g} "
                f"({kind} {self.rule.threshold:g}{floor}, stable {self.stable:.4g})")

    def describe(self) -> dict:
        """The verdict as the audit log writes it: the rule, both sides' figures, the limit and the samples."""
        out = {**self.rule.describe(), "canary": self.canary, "stable": self.stable, "limit": self.limit,
               "samples": {"canary": self.canary_samples, "stable": self.stable_samples}, "verdict": self.verdict}
        return out | ({"no_data": self.no_data} if self.no_data else {})


# Either side's backend figures, or why there are none (a backend without /metrics, too few scrapes yet).
BackendSide = BackendFigures | str


def _missing(rule: Rule, canary: SideFigures | str, stable: SideFigures | str) -> str | None:
    """Why a backend rule has nothing to read on either side, or None."""
    field = METRICS[rule.metric].figure
    for side, f in (("canary", canary), ("stable", stable)):
        if isinstance(f, str):
            return f"{side}: {f}"
        if isinstance(f, BackendFigures) and field in f.unexposed:
            return f"{side}: its /metrics ({f.prefix}) has no series for {rule.metric}"
    return None


def judge(rules: CanaryRules, canary: SideFigures, stable: SideFigures,
          backend: tuple[BackendSide, BackendSide] | None = None) -> list[RuleVerdict]:
    """Every rule on the same window, each on its source: held, broken, too few values on one side to say, or
    (a backend rule) no data at all. `backend`: (canary, stable) from their /metrics, None when not scraped."""
    verdicts = []
    for rule in rules.rules:
        metric = METRICS[rule.metric]
        sides = (canary, stable) if rule.source == PROXY else backend or ("not scraped", "not scraped")
        missing = _missing(rule, *sides) if rule.source == BACKEND else None
        if missing is not None:
            verdicts.append(RuleVerdict(rule, NO_DATA, None, None, None, 0, 0, missing))
            continue
        c_side, s_side = sides
        c, s = getattr(c_side, metric.figure), getattr(s_side, metric.figure)
        nc, ns = getattr(c_side, metric.samples), getattr(s_side, metric.samples)
        if min(nc, ns) < rules.min_samples or c is None or s is None:
            verdicts.append(RuleVerdict(rule, TOO_FEW, c, s, None, nc, ns))
        else:
            verdicts.append(RuleVerdict(rule, BROKEN if rule.breaks(c, s) else HELD, c, s, rule.limit(s), nc, ns))
    return verdicts
