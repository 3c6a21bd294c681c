"""The thresholds a user writes before the eval runs (a YAML file, as the canary's rules: tally/ops/canary_rules.py),
checked against the suites before any model loads, and judged on the scores after."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from tally.errors import ConfigError, echo
from tally.units import parse_fraction

THRESHOLDS = {"max_drop": "candidate ≥ baseline − max_drop (points of score, a fraction or N%)",
              "min_score": "candidate ≥ min_score (a fraction or N%)"}
DECIDE = ("ci", "estimate")
DEFAULT_CONFIDENCE = 0.95
DEFAULT_MIN_ITEMS = 10
HELD, BROKEN, TOO_FEW = "held", "broken", "too_few_items"


@dataclass(frozen=True)
class SuiteRule:
    metric: str  # all | a scorer's name | json_fields.FIELD
    tag: str  # all, or an item tag
    kind: str  # max_drop | min_score
    threshold: float  # a fraction of score

    @property
    def name(self) -> str:
        return self.metric if self.tag == "all" else f"{self.metric} (tag {self.tag})"


@dataclass(frozen=True)
class SuiteRules:
    """A rules file:

        confidence: 0.95   # of the bootstrap intervals (two-sided)
        decide: ci         # ci: a rule holds when the whole interval is on the right side of its threshold;
                           # estimate: when the mean itself is
        min_items: 10      # a rule judged on fewer items breaks: too few to say
        rules:
          - {metric: all, max_drop: 2%}                   # every item's score, candidate vs baseline
          - {metric: json_fields, tag: long, max_drop: 4%}
          - {metric: json_fields.total, max_drop: 5%}     # one extracted field
          - {metric: code, min_score: 50%}                # the candidate's own pass rate

    `metric` is `all`, a scorer's name (exact, normalized, regex, json_schema, json_fields, numeric, code) or
    `json_fields.FIELD`; `tag` (default all) one of the items' tags."""
    rules: tuple[SuiteRule, ...]
    confidence: float = DEFAULT_CONFIDENCE
    decide: str = "ci"
    min_items: int = DEFAULT_MIN_ITEMS

    @property
    def compares(self) -> bool:
        return any(r.kind == "max_drop" for r in self.rules)


def _rule(item: object, where: str) -> SuiteRule:
    if not isinstance(item, dict) or not isinstance(item.get("metric"), str):
        raise ConfigError(f"{where} must be a mapping with a metric, e.g. {{metric: all, max_drop: 2%}}")
    where = f"{where} ({item['metric']})"
    unknown = sorted(set(item) - {"metric", "tag", *THRESHOLDS})
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; a rule has metric, tag and one of "
                          f"{', '.join(THRESHOLDS)}")
    kinds = [k for k in THRESHOLDS if k in item]
    if len(kinds) != 1:
        raise ConfigError(f"{where} takes exactly one threshold: " + "; ".join(f"{k}: {m}" for k, m in
                                                                              THRESHOLDS.items()))
    kind, raw = kinds[0], item[kinds[0]]
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        raise ConfigError(f"{where}: {kind} must be a fraction or N%, got {echo(raw)}")
    value = parse_fraction(raw, f"{where} {kind}")
    if not math.isfinite(value) or not 0 <= value <= 1:
        raise ConfigError(f"{where}: {kind} {raw!r} is out of range; write a fraction in [0, 1] (0.02) or 2%")
    tag = item.get("tag", "all")
    if not isinstance(tag, str):
        raise ConfigError(f"{where}: tag must be a word, got {echo(tag)}")
    return SuiteRule(item["metric"], tag, kind, value)


def parse_rules(data: object, source: str) -> SuiteRules:
    if not isinstance(data, dict):
        raise ConfigError(f"--rules {source}: expected a mapping with a `rules:` list; see docs/quality.md")
    unknown = sorted(set(data) - {"rules", "confidence", "decide", "min_items"})
    if unknown:
        raise ConfigError(f"--rules {source}: unknown key(s) {unknown}; known: rules, confidence, decide, min_items")
    items = data.get("rules")
    if not isinstance(items, list) or not items:
        raise ConfigError(f"--rules {source}: needs at least one rule under `rules:`, e.g. "
                          "- {metric: all, max_drop: 2%}")
    rules = tuple(_rule(item, f"--rules {source} rule {i}") for i, item in enumerate(items, 1))
    confidence = data.get("confidence", DEFAULT_CONFIDENCE)
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0.5 <= confidence < 1:
        raise ConfigError(f"--rules {source}: confidence must be a number in [0.5, 1), e.g. 0.95; got {confidence!r}")
    decide = data.get("decide", "ci")
    if decide not in DECIDE:
        raise ConfigError(f"--rules {source}: decide must be one of {', '.join(DECIDE)}, got {echo(decide)}")
    min_items = data.get("min_items", DEFAULT_MIN_ITEMS)
    if isinstance(min_items, bool) or not isinstance(min_items, int) or min_items < 1:
        raise ConfigError(f"--rules {source}: min_items must be a whole number ≥ 1, got {min_items!r}")
    return SuiteRules(rules, float(confidence), decide, min_items)


def load_rules(path: Path) -> SuiteRules:
    try:
        import yaml
    except ImportError:
        raise ConfigError("--rules needs PyYAML: pip install 'tally[eval]'") from None
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"--rules {path}: cannot read it ({e.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"--rules {path} is not valid YAML: {e}") from None
    return parse_rules(data, str(path))


def check_against(rules: SuiteRules, metrics: set[str], tags: set[str], compares: bool, source: str) -> None:
    """Before any model runs: each rule names a metric and a tag the suites have, and max_drop has a candidate."""
    for rule in rules.rules:
        if rule.metric not in metrics:
            raise ConfigError(f"--rules {source}: rule {rule.name}: no item of the suites gives metric "
                              f"{rule.metric!r}; they give {', '.join(sorted(metrics))}")
        if rule.tag not in tags:
            raise ConfigError(f"--rules {source}: rule {rule.name}: no item of the suites has tag {rule.tag!r}; "
                              f"tags: {', '.join(sorted(tags))}")
        if rule.kind == "max_drop" and not compares:
            raise ConfigError(f"--rules {source}: rule {rule.name} is a max_drop, which compares two models; give "
                              "a --candidate (or a candidate option), or use min_score")
