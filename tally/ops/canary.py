"""The canary controller: which side each new request goes to, and — every evaluation interval — whether the
current step holds, advances or rolls back, judged on the same window of both sides' responses (as the proxy saw
them) and of both sides' backends' own /metrics (tally/ops/backend_metrics.py), each rule on the source it names.

A step advances once its rules have held, with enough samples, for its whole duration (time spent holding for want
of samples, or of a backend's /metrics for a backend rule, does not count); the first broken rule sets the canary's
weight to 0 for good. Requests already in flight finish where they are, so no weight change loses one. Every
decision is one JSON line in the audit log, with both sources' figures.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client import Counter as PromCounter

from tally.errors import ConfigError
from tally.ops.backend_metrics import BackendScrapes
from tally.ops.canary_plan import PlanStep, parse_plan
from tally.ops.canary_rules import (
    BACKEND,
    BROKEN,
    NO_DATA,
    PROXY,
    TOO_FEW,
    CanaryRules,
    Sample,
    SideFigures,
    figures,
    judge,
    load_rules,
)

STABLE, CANARY = "stable", "canary"
RUNNING, ROLLED_BACK, DONE = "running", "rolled_back", "done"
DEFAULT_EVAL_INTERVAL_S = 5.0
FIGURES = ("error_rate", "ttft_p99_s", "tpot_p99_s", "mean_output_tokens", "length_share")
log = logging.getLogger("tally.route")


@dataclass(frozen=True)
class CanaryConfig:
    urls: tuple[str, ...]
    plan: tuple[PlanStep, ...]
    rules: CanaryRules
    eval_interval_s: float = DEFAULT_EVAL_INTERVAL_S
    audit_log: Path | None = None
    sticky_header: str | None = None

    @classmethod
    def from_args(cls, urls: list[str], plan: str | None, rules: Path | None, eval_interval_s: float,
                  audit_log: Path | None = None, sticky_header: str | None = None) -> CanaryConfig:
        """`tally route --canary ...`'s flags, checked once: a canary without rules to roll it back is refused."""
        if not plan or rules is None:
            raise ConfigError("--canary needs --plan (e.g. 5%:2h,20%:2h,50%:2h,100%) and --rules rules.yaml (the "
                              "rollback rules; docs/operations.md has an example)")
        if eval_interval_s <= 0:
            raise ConfigError("--eval-interval must be above 0 s")
        steps, loaded = parse_plan(plan), load_rules(rules)
        if loaded.window_s < eval_interval_s:
            raise ConfigError(f"--rules {rules}: window ({loaded.window_s:g} s) is shorter than --eval-interval "
                              f"({eval_interval_s:g} s); responses between two evaluations would be judged by none")
        if audit_log is not None and not os.access(audit_log if audit_log.exists() else audit_log.parent, os.W_OK):
            raise ConfigError(f"--audit-log {audit_log}: cannot write there (no such folder, or no permission)")
        return cls(tuple(u.rstrip("/") for u in urls), steps, loaded, eval_interval_s, audit_log, sticky_header)


@dataclass
class CanaryState:
    weight: float
    step_started_s: float
    last_eval_s: float
    phase: str = RUNNING  # RUNNING, ROLLED_BACK or DONE
    step: int = 0
    held_s: float = 0.0  # time this step's rules held, summed over passing evaluations
    reason: str | None = None  # why it rolled back
    routed: int = 0  # requests without a sticky value this step, and how many went to the canary
    routed_canary: int = 0
    decisions: Counter = field(default_factory=Counter)
    last: dict | None = None  # the latest audit record


def _bucket(value: str) -> float:
    """A sticky value's fixed place in [0, 1): on the canary while below the weight, so as weights rise a
    session only ever moves from stable to canary, and a rollback (weight 0) moves everyone back."""
    return int(hashlib.sha1(value.encode()).hexdigest()[:15], 16) / 16**15


def _rounded(f: SideFigures | str) -> dict:
    if isinstance(f, str):
        return {"no_data": f}
    return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(f).items()}


class Canary:
    def __init__(self, config: CanaryConfig, now_s: float, registry: CollectorRegistry,
                 stable_urls: tuple[str, ...] = ()) -> None:
        """`stable_urls`: the stable replicas, whose /metrics are the stable side's second source."""
        self.config = config
        self.state = CanaryState(config.plan[0].weight, now_s, now_s)
        self.samples: dict[str, deque[Sample]] = {STABLE: deque(), CANARY: deque()}
        # Scrapes are kept a little past the window: its start is the first scrape inside it.
        self.backends = BackendScrapes({CANARY: config.urls, STABLE: tuple(u.rstrip("/") for u in stable_urls)},
                                       config.rules.window_s + 2 * config.eval_interval_s)
        self.audit = config.audit_log.open("a") if config.audit_log else None
        self.weight_gauge = Gauge("tally_route_canary_weight_ratio", "Share of new requests sent to the canary.",
                                  registry=registry)
        self.step_gauge = Gauge("tally_route_canary_step", "Index of the canary plan's current step.",
                                registry=registry)
        self.decisions = PromCounter("tally_route_canary_decisions", "Canary decisions, by kind.", ["decision"],
                                     registry=registry)
        self.window = Gauge("tally_route_canary_window",
                            "The last evaluation's figures, by side, source (proxy, backend) and figure.",
                            ["side", "source", "figure"], registry=registry)
        self.weight_gauge.set(self.state.weight)
        self._decide("start", {"plan": [asdict(s) for s in config.plan],
                               "rules": [r.describe() for r in config.rules.rules],
                               "min_samples": config.rules.min_samples, "window_s": config.rules.window_s,
                               "backends": {side: list(urls) for side, urls in self.backends.sides.items()}})

    @property
    def running(self) -> bool:
        return self.state.phase == RUNNING

    def sides(self, sticky_value: str | None) -> tuple[str, ...]:
        """Sides to try for a new request, in order: its own side first, the other as failover — never a canary
        that was rolled back."""
        s = self.state
        if s.phase == ROLLED_BACK:
            return (STABLE,)
        if sticky_value is not None:
            canary = _bucket(sticky_value) < s.weight
        else:  # a running count rather than a coin, so a step's split is exact even over few requests
            s.routed += 1
            canary = s.routed_canary < s.weight * s.routed
            s.routed_canary += canary
        return (CANARY, STABLE) if canary else (STABLE, CANARY)

    def record(self, side: str, sample: Sample) -> None:
        if self.running:
            self.samples[side].append(sample)

    def evaluate(self, now_s: float) -> dict:
        """One evaluation: both sides' figures over the same window, every rule's verdict, the decision."""
        s, plan = self.state, self.config.plan
        since_s = max(s.step_started_s, now_s - self.config.rules.window_s)
        for side in self.samples.values():
            while side and side[0].end_s < since_s:
                side.popleft()
        canary, stable = figures(self.samples[CANARY]), figures(self.samples[STABLE])
        backend = (self._backend(CANARY, since_s, now_s), self._backend(STABLE, since_s, now_s))
        verdicts = judge(self.config.rules, canary, stable, backend)
        step, elapsed_s, s.last_eval_s = s.step, now_s - s.last_eval_s, now_s
        broken = [v for v in verdicts if v.verdict == BROKEN]
        too_few = [v for v in verdicts if v.verdict in (TOO_FEW, NO_DATA)]  # nothing to judge by: hold
        if broken:
            decision, reason = "rollback", "; ".join(v.explain() for v in broken)
            s.phase, s.weight, s.reason = ROLLED_BACK, 0.0, reason
        elif too_few:
            decision, reason = "hold", "; ".join(v.explain() for v in too_few)
        else:
            s.held_s += elapsed_s
            decision, reason = "continue", f"every rule held; {s.held_s:.1f} of {plan[step].hold_s:g} s"
        held_s = s.held_s
        if decision == "continue" and held_s >= plan[step].hold_s:
            decision = self._next_step(now_s)
            reason = f"every rule held for {held_s:.1f} s at {plan[step].weight * 100:g}%"
        for source, pair in ((PROXY, (canary, stable)), (BACKEND, backend)):
            for side, f in zip((CANARY, STABLE), pair):
                for name in FIGURES:
                    value = None if isinstance(f, str) else getattr(f, name)
                    self.window.labels(side, source, name).set(float("nan") if value is None else value)
        return self._decide(decision, {
            "step": step, "weight": plan[step].weight, "next_weight": s.weight, "held_s": held_s,
            "step_hold_s": plan[step].hold_s, "window_s": now_s - since_s, "reason": reason,
            "sides": {CANARY: _rounded(canary), STABLE: _rounded(stable)},
            "backend": {CANARY: _rounded(backend[0]), STABLE: _rounded(backend[1])},
            "rules": [v.describe() for v in verdicts]})

    def _backend(self, side: str, since_s: float, now_s: float) -> SideFigures | str:
        """The side's figures from its backends' /metrics, or why there are none; a backend whose scrapes cannot
        be read is no data for the backend rules, not a failed evaluation."""
        try:
            return self.backends.side(side, since_s, now_s)
        except Exception as exc:  # a bug reading one server's page must not roll a canary back
            log.exception("canary: reading the %s backends' /metrics failed", side)
            return f"reading its backends' /metrics failed: {exc!r}"

    def fail_safe(self, error: str) -> dict:
        """An evaluation that cannot run leaves nothing to judge the canary by: roll it back rather than keep
        sending it traffic unwatched."""
        s = self.state
        s.phase, s.weight, s.reason = ROLLED_BACK, 0.0, f"evaluation failed: {error}"
        return self._decide("rollback", {"step": s.step, "next_weight": 0.0, "reason": s.reason})

    def _next_step(self, now_s: float) -> str:
        """Moves to the plan's next step with a fresh window; "done" when that is the final 100%."""
        s = self.state
        s.step += 1
        s.weight, s.held_s, s.step_started_s, s.routed, s.routed_canary = \
            self.config.plan[s.step].weight, 0.0, now_s, 0, 0
        for side in self.samples.values():
            side.clear()
        if self.config.plan[s.step].hold_s is None:
            s.phase = DONE
            return "done"
        return "advance"

    def _decide(self, decision: str, details: dict) -> dict:
        record = {"time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"), "decision": decision,
                  **details}
        self.state.decisions[decision] += 1
        self.state.last = record
        self.decisions.labels(decision).inc()
        self.weight_gauge.set(self.state.weight)
        self.step_gauge.set(self.state.step)
        if self.audit is not None:
            try:
                self.audit.write(json.dumps(record) + "\n")
                self.audit.flush()  # a rollback must be on disk even if the proxy dies next
            except (OSError, ValueError) as exc:  # a full disk, a closed file: the decisions stand regardless
                log.error("canary audit log %s: %s; decision %s taken anyway", self.config.audit_log, exc, decision)
        self._log(decision, details)
        return record

    def _log(self, decision: str, details: dict) -> None:
        """Each decision as one line: the settings at start, then every evaluation's verdict."""
        s, c = self.state, self.config
        if decision == "start":
            plan = ", ".join(f"{p.weight * 100:g}%" + (f" for {p.hold_s:g} s" if p.hold_s is not None else "")
                             for p in c.plan)
            rules = ", ".join(f"{r.name} {r.kind} {r.threshold:g}" for r in c.rules.rules)
            log.info("canary start: %s at %g%% of new requests; plan %s; rules %s over %g s windows of at least %d "
                     "samples, judged every %g s%s%s", ", ".join(c.urls), s.weight * 100, plan, rules,
                     c.rules.window_s, c.rules.min_samples, c.eval_interval_s,
                     f"; sticky header {c.sticky_header}" if c.sticky_header else "",
                     f"; audit log {c.audit_log}" if c.audit_log else "")
            return
        log.log(logging.WARNING if decision == "rollback" else logging.INFO, "canary %s at step %d of %d: weight "
                "now %g%%; %s", decision, details["step"] + 1, len(c.plan), s.weight * 100, details["reason"])

    def status(self) -> dict:
        s = self.state
        return {"phase": s.phase, "weight": s.weight, "step": s.step, "held_s": s.held_s, "reason": s.reason,
                "urls": list(self.config.urls), "plan": [asdict(p) for p in self.config.plan],
                "sticky_header": self.config.sticky_header, "eval_interval_s": self.config.eval_interval_s,
                "decisions": dict(s.decisions), "last_decision": s.last,
                "backends": {url: {"side": side, "scrapes": len(self.backends.history[url]),
                                   "problem": self.backends.problem[url]}
                             for side, urls in self.backends.sides.items() for url in urls}}

    def close(self) -> None:
        if self.audit is not None:
            self.audit.close()
