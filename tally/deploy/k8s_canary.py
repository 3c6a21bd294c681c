"""`tally deploy k8s --canary`: what the canary is asked for, checked once — its pods' `tally serve` flags and
image, and the rollout the `tally route` router in front of both runs. The plan and rules go through the check
`tally route` itself makes at start (tally/ops/canary.py:CanaryConfig.from_args), so a rollout the router would
refuse is refused before any manifest is written."""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from tally.errors import ConfigError
from tally.ops.canary import DEFAULT_EVAL_INTERVAL_S, CanaryConfig
from tally.ops.canary_rules import BACKEND
from tally.units import parse_duration_s


@dataclass(frozen=True)
class CanaryRollout:
    serve_flags: tuple[str, ...]  # tally serve flags after the stable pods' own: where both set one, these win
    image: str | None  # None: the stable pods' image
    replicas: int  # the canary autoscaler's floor
    plan: str  # tally route --plan, as given (checked)
    rules_yaml: str  # the rules file's text (checked), which the router's ConfigMap holds
    eval_interval: str | None  # tally route --eval-interval, as given (checked); None: its default
    sticky_header: str | None  # tally route --sticky-header

    @classmethod
    def from_args(cls, flags: str | None, image: str | None, replicas: int | None, plan: str | None,
                  rules: Path | None, eval_interval: str | None, sticky_header: str | None) -> CanaryRollout | None:
        """`tally deploy k8s --canary...` flags; None when no canary is asked for."""
        if flags is None and image is None:
            if any(v is not None for v in (replicas, plan, rules, eval_interval, sticky_header)):
                raise ConfigError("--canary-plan, --canary-rules, --canary-replicas, --canary-eval-interval and "
                                  "--canary-sticky-header go with a canary: --canary 'TALLY SERVE FLAGS' and/or "
                                  "--canary-image IMAGE")
            return None
        if not plan or rules is None:
            raise ConfigError("a canary needs --canary-plan (e.g. 5%:2h,20%:2h,50%:2h,100%) and --canary-rules FILE "
                              "(the rollback rules the router judges it by; docs/operations.md has an example)")
        if replicas is not None and replicas < 1:
            raise ConfigError(f"--canary-replicas must be at least 1, got {replicas}")
        try:
            serve_flags = tuple(shlex.split(flags or ""))
        except ValueError as exc:
            raise ConfigError(f"--canary {flags!r} cannot be split into flags ({exc}); quote it as a shell "
                              "would") from None
        eval_interval_s = parse_duration_s(eval_interval, "--canary-eval-interval") if eval_interval \
            else DEFAULT_EVAL_INTERVAL_S
        try:  # the canary's URL is the router's to know; the check reads none
            checked = CanaryConfig.from_args([], plan, rules, eval_interval_s, None, sticky_header)
        except ConfigError as exc:
            raise ConfigError(f"the router would refuse this rollout at start (tally route --plan/--rules/"
                              f"--eval-interval, given here as --canary-plan/--canary-rules/--canary-eval-interval): "
                              f"{exc.message}") from None
        for number, rule in enumerate(checked.rules.rules, 1):
            if rule.source == BACKEND:
                raise ConfigError(f"--canary-rules {rules} rule {number} ({rule.metric}) reads the backends' own "
                                  f"/metrics (source: {BACKEND}); here each side is a Service, whose scrapes reach "
                                  "any of its pods in turn, so no one server's counters can be followed over the "
                                  "window: judge the canary on what the router measures (source: proxy, the "
                                  "default)")
        return cls(serve_flags, image, 1 if replicas is None else replicas, plan, rules.read_text(), eval_interval,
                   sticky_header)
