"""A canary plan: the share of new requests the canary gets, step by step, and how long every rule must hold
before the next step — `"5%:2h,20%:2h,50%:2h,100%"`.

Every step but the last is `weight%:duration` (durations in s, m or h; ms and bare seconds also read); weights
rise strictly; the last step is a bare `100%`, the canary becoming the fleet. Nothing is compared at 100% (no
stable traffic is left to compare with), so that step takes no duration, and a plan that stops short of it is
refused rather than left half-rolled-out forever.
"""
from __future__ import annotations

from dataclasses import dataclass

from tally.errors import ConfigError
from tally.units import parse_duration_s

EXAMPLE = "5%:2h,20%:2h,50%:2h,100%"


@dataclass(frozen=True)
class PlanStep:
    weight: float  # share of new requests sent to the canary, 0 < weight ≤ 1
    hold_s: float | None  # seconds every rule must hold before the next step; None for the final 100%


def _weight(text: str, where: str) -> float:
    raw = text.strip()
    try:
        percent = float(raw[:-1]) if raw.endswith("%") else None
    except ValueError:
        percent = None
    if percent is None:
        raise ConfigError(f"--plan {where}: weight {raw!r} is not a percentage; write it like 5% (e.g. {EXAMPLE})")
    if not 0 < percent <= 100:  # also refuses nan
        raise ConfigError(f"--plan {where}: weight {raw} must be above 0% and at most 100%")
    return percent / 100


def parse_plan(text: str) -> tuple[PlanStep, ...]:
    """`'5%:2h,20%:2h,100%'` → its steps; a plan that cannot be followed as written is refused here."""
    if not text.strip():
        raise ConfigError(f"--plan is empty; write it like {EXAMPLE}")
    items = [item.strip() for item in text.split(",")]
    if any(not item for item in items):
        raise ConfigError(f"--plan {text!r} has an empty step; write it like {EXAMPLE}")
    steps = []
    for number, item in enumerate(items, 1):
        where = f"step {number} ({item!r})"
        weight_text, sep, duration_text = item.partition(":")
        weight = _weight(weight_text, where)
        if steps and weight <= steps[-1].weight:
            raise ConfigError(f"--plan weights must rise step by step; {where} does not rise above "
                              f"{steps[-1].weight * 100:g}%")
        last = number == len(items)
        if last:
            if weight != 1:
                raise ConfigError(f"--plan ends at {weight_text.strip()}; it must end with a bare 100% (the canary "
                                  f"becomes the fleet). To look longer at {weight_text.strip()}, give that step a "
                                  f"longer duration")
            if sep:
                raise ConfigError(f"--plan {where}: the final 100% step takes no duration; at 100% there is no "
                                  "stable traffic left to compare the canary with")
            steps.append(PlanStep(1.0, None))
            continue
        if not sep:
            raise ConfigError(f"--plan {where} needs a duration, e.g. {weight_text.strip()}:2h; only the final "
                              "100% step has none")
        hold_s = parse_duration_s(duration_text, f"--plan {where} duration")
        if hold_s <= 0:
            raise ConfigError(f"--plan {where}: the duration must be above 0 s")
        steps.append(PlanStep(weight, hold_s))
    if len(steps) < 2:
        raise ConfigError(f"--plan {text!r} goes straight to 100%; give the canary at least one smaller step "
                          f"first, e.g. {EXAMPLE}")
    return tuple(steps)
