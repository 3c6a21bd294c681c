"""The canary's parts without servers: plans and rules files are read or refused with a message that says what to
write; figures and verdicts come out of known samples; the meter reads a stream split anywhere; the controller
holds, advances and rolls back on a clock the test turns."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tally.errors import ConfigError
from tally.ops.canary import CANARY, STABLE, Canary, CanaryConfig
from tally.ops.canary_plan import PlanStep, parse_plan
from tally.ops.canary_rules import (
    BROKEN,
    HELD,
    TOO_FEW,
    CanaryRules,
    Rule,
    Sample,
    figures,
    judge,
    load_rules,
)
from tally.ops.response_meter import ResponseMeter

EXAMPLE_RULES = """\
min_samples: 20
window: 5m
rules:
  - {metric: ttft_p99, max_ratio: 1.5}
  - {metric: tpot_p99, max_ratio: 1.5}
  - {metric: error_rate, max_increase: 1%}
  - {metric: mean_output_tokens, min_ratio: 0.8}
  - {metric: length_share, max_increase: 0.05}
"""


def test_a_plan_reads_weights_and_durations_in_s_m_h():
    assert parse_plan("5%:2h,20%:30m,50%:90s,100%") == (
        PlanStep(0.05, 7200.0), PlanStep(0.2, 1800.0), PlanStep(0.5, 90.0), PlanStep(1.0, None))


@pytest.mark.parametrize("plan, says", [
    ("50%:1h,20%:1h,100%", "must rise"),
    ("5%:1h,120%:1h,100%", "at most 100%"),
    ("5%:1h,50%:1h", "must end with a bare 100%"),
    ("5%:1h,100%:1h", "final 100% step takes no duration"),
    ("5%,100%", "needs a duration"),
    ("5%:2d,100%", "is not a duration"),
    ("5%:0s,100%", "above 0 s"),
    ("5:1h,100%", "not a percentage"),
    ("100%", "at least one smaller step"),
    ("5%:1h,,100%", "empty step"),
])
def test_a_plan_that_cannot_be_followed_is_refused(plan, says):
    with pytest.raises(ConfigError, match=says):
        parse_plan(plan)


def test_the_documented_rules_file_loads(tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text(EXAMPLE_RULES)
    rules = load_rules(path)
    assert (rules.min_samples, rules.window_s) == (20, 300.0)
    assert [(r.metric, r.kind, r.threshold) for r in rules.rules] == [
        ("ttft_p99", "max_ratio", 1.5), ("tpot_p99", "max_ratio", 1.5), ("error_rate", "max_increase", 0.01),
        ("mean_output_tokens", "min_ratio", 0.8), ("length_share", "max_increase", 0.05)]


@pytest.mark.parametrize("text, says", [
    ("rules: [", "not valid YAML"),
    ("- metric: ttft_p99", "expected a mapping"),
    ("min_samples: 5", "needs at least one rule"),
    ("rules: [{metric: ttft, max_ratio: 2}]", "unknown metric 'ttft'"),
    ("rules: [{metric: ttft_p99, min_ratio: 2}]", "takes exactly one threshold, max_ratio"),
    ("rules: [{metric: error_rate}]", "takes exactly one threshold, max_increase"),
    ("rules: [{metric: ttft_p99, max_ratio: fast}]", "must be a number"),
    ("rules: [{metric: error_rate, max_increase: 150%}]", "over 100%"),
    ("rules: [{metric: ttft_p99, max_ratio: -1}]", "out of range"),
    ("rules: [{metric: ttft_p99, max_ratio: 2}]\nmin_samples: 0", "min_samples must be a whole number"),
    ("rules: [{metric: ttft_p99, max_ratio: 2}]\nwindow: soon", "is not a duration"),
    ("rules: [{metric: ttft_p99, max_ratio: 2}]\nrule: []", "unknown key"),
])
def test_a_bad_rules_file_is_refused_with_what_to_write(tmp_path, text, says):
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=says):
        load_rules(path)


@pytest.mark.parametrize("text, says", [
    ("rules: [{metric: ttft_p99, max_ratio: 2, source: server}]", "source 'server' is not one of proxy, backend"),
    ("rules: [{metric: ttft_p99, max_ratio: 2, source: [proxy]}]", "is not one of proxy, backend"),
    ("rules: [{metric: error_rate, max_increase: 1%, min_delta_ms: 5}]", "min_delta_ms is a latency rule's floor"),
    ("rules: [{metric: ttft_p99, max_ratio: 2, min_delta_ms: -1}]", "min_delta_ms must be a number of milliseconds"),
    ("rules: [{metric: ttft_p99, max_ratio: 2, min_delta_ms: 10ms}]", "min_delta_ms must be a number of milliseconds"),
    ("rules: [{metric: tpot_p99, max_ratio: 2, min_delta_ms: .nan}]", "min_delta_ms must be a number of milliseconds"),
    ("rules: [{metric: tpot_p99, max_ratio: 2, min_delta_ms: true}]", "min_delta_ms must be a number of milliseconds"),
    ("rules: [{metric: tpot_p99, source: backend}]", "takes exactly one threshold, max_ratio"),
])
def test_a_bad_source_or_floor_is_refused_at_start(tmp_path, text, says):
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=says):
        load_rules(path)


def test_sources_and_floors_are_read_with_their_defaults(tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text("rules:\n"
                    "  - {metric: ttft_p99, max_ratio: 1.3}\n"
                    "  - {metric: tpot_p99, max_ratio: 1.3, source: backend, min_delta_ms: 0}\n"
                    "  - {metric: ttft_p99, max_ratio: 1.3, source: proxy, min_delta_ms: 25}\n"
                    "  - {metric: length_share, max_increase: 5%, source: backend}\n")
    rules = load_rules(path).rules
    assert [(r.source, r.floor_s) for r in rules] == [
        ("proxy", 0.010), ("backend", 0.0), ("proxy", 0.025), ("backend", None)]
    assert load_rules(path).reads_backends
    assert rules[0].describe() == {"metric": "ttft_p99", "source": "proxy", "max_ratio": 1.3, "min_delta_ms": 10.0}
    assert rules[3].describe() == {"metric": "length_share", "source": "backend", "max_increase": 0.05}


def _latency(n: int, ttft_s: float, tpot_s: float) -> list[Sample]:
    return [Sample(0.0, False, ttft_s, tpot_s, 40, ("stop",)) for _ in range(n)]


@pytest.mark.parametrize("rule, canary_ms, stable_ms, verdict", [
    # 3 ms against 2 ms is 1.5 x, but 1 ms is no regression anyone feels.
    (Rule("ttft_p99", 1.3), 3, 2, HELD),
    (Rule("ttft_p99", 1.3), 11.9, 2, HELD),  # within the 10 ms default floor
    (Rule("ttft_p99", 1.3), 12.5, 2, BROKEN),  # worse by the ratio and by more than the floor
    (Rule("ttft_p99", 1.3), 125, 100, HELD),  # worse by more than the floor, not by the ratio
    (Rule("ttft_p99", 1.3), 131, 100, BROKEN),
    (Rule("tpot_p99", 1.3), 3, 2, HELD),  # 2 ms default floor for TPOT
    (Rule("tpot_p99", 1.3), 4.5, 2, BROKEN),
    (Rule("tpot_p99", 1.3, min_delta_s=0.0), 3, 2, BROKEN),  # min_delta_ms: 0 — the ratio alone
    (Rule("ttft_p99", 1.3, min_delta_s=0.05), 140, 100, HELD),
])
def test_a_latency_rule_breaks_only_past_its_ratio_and_its_floor(rule, canary_ms, stable_ms, verdict):
    def side(ms: float):
        ttft_s, tpot_s = (ms / 1000, 0.01) if rule.metric == "ttft_p99" else (0.1, ms / 1000)
        return figures(_latency(30, ttft_s, tpot_s))

    (judged,) = judge(CanaryRules((rule,), min_samples=20), side(canary_ms), side(stable_ms))
    assert judged.verdict == verdict, judged.explain()
    assert judged.limit == pytest.approx(max(stable_ms * 1.3, stable_ms + rule.floor_s * 1000) / 1000)
    assert f"min_delta {rule.floor_s * 1000:g} ms" in judged.explain()


def test_the_rules_file_in_the_docs_loads(tmp_path):
    doc = (Path(__file__).resolve().parents[1] / "docs" / "operations.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", doc, flags=re.S)
    assert blocks, "docs/operations.md shows no rules file"
    for block in blocks:
        (tmp_path / "rules.yaml").write_text(block)
        assert load_rules(tmp_path / "rules.yaml").rules


def test_a_missing_rules_file_asks_for_the_rollback_rules(tmp_path):
    with pytest.raises(ConfigError, match="write the rollback rules first"):
        load_rules(tmp_path / "nope.yaml")


def _samples(n: int, ttft_s: float = 0.1, tokens: int = 40, reason: str = "stop", errors: int = 0) -> list[Sample]:
    return [Sample(0.0, error=True) for _ in range(errors)] + [
        Sample(0.0, False, ttft_s, ttft_s / 10, tokens, (reason,)) for _ in range(n - errors)]


@pytest.mark.parametrize("rule, canary, verdict", [
    (Rule("ttft_p99", 1.5), _samples(30, ttft_s=0.14), HELD),
    (Rule("ttft_p99", 1.5), _samples(30, ttft_s=0.16), BROKEN),
    (Rule("tpot_p99", 1.5), _samples(30, ttft_s=0.2), BROKEN),
    (Rule("error_rate", 0.05), _samples(30, errors=1), HELD),
    (Rule("error_rate", 0.05), _samples(30, errors=2), BROKEN),
    (Rule("mean_output_tokens", 0.8), _samples(30, tokens=33), HELD),
    (Rule("mean_output_tokens", 0.8), _samples(30, tokens=31), BROKEN),
    (Rule("length_share", 0.1), _samples(30, reason="length"), BROKEN),
    (Rule("ttft_p99", 1.5), _samples(19, ttft_s=9.0), TOO_FEW),
])
def test_each_rule_compares_canary_with_stable_on_the_same_window(rule, canary, verdict):
    rules = CanaryRules((rule,), min_samples=20)
    (judged,) = judge(rules, figures(canary), figures(_samples(40)))
    assert judged.verdict == verdict, judged.explain()


def test_figures_leave_failed_requests_out_of_latency_and_lengths():
    f = figures(_samples(10, ttft_s=0.2, tokens=7, reason="length", errors=2))
    assert (f.requests, f.errors, f.error_rate) == (10, 2, 0.2)
    assert (f.ttft_samples, f.output_samples, f.finished_choices) == (8, 8, 8)
    assert f.mean_output_tokens == 7 and f.length_share == 1.0 and f.ttft_p99_s == pytest.approx(0.2)


SSE = (b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
       b'data: {"choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}\n\n'
       b'data: {"choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":null}]}\n\n'
       b'data: {"choices":[{"index":0,"delta":{"content":"!"},"finish_reason":"length"}]}\n\n'
       b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5}}\n\n'
       b'data: [DONE]\n\n')


@pytest.mark.parametrize("size", [1, 7, 64, len(SSE)])
def test_the_meter_reads_a_stream_however_it_is_split(size):
    meter = ResponseMeter(0.0, 200, "text/event-stream; charset=utf-8", None)
    for start in range(0, len(SSE), size):
        meter.feed(SSE[start:start + size], start / 1000)
    sample = meter.sample(1.0, broken=False)
    assert (sample.error, sample.output_tokens, sample.finish_reasons) == (False, 5, ("length",))
    assert sample.ttft_s is not None and sample.tpot_s is not None


def test_the_meter_times_first_output_not_the_role_chunk():
    meter = ResponseMeter(0.0, 200, "text/event-stream", None)
    lines = SSE.split(b"\n\n")
    for t, event in zip([0.1, 0.3, 0.4, 0.5, 0.5, 0.5], lines):
        meter.feed(event + b"\n\n", t)
    sample = meter.sample(0.6, broken=False)
    assert sample.ttft_s == pytest.approx(0.3)
    assert sample.tpot_s == pytest.approx((0.5 - 0.3) / 4)  # 5 tokens from usage, first to last output event


def test_the_meter_reads_a_json_body_and_calls_errors_errors():
    body = json.dumps({"choices": [{"index": 0, "text": "hi", "finish_reason": "stop"}],
                       "usage": {"completion_tokens": 2}}).encode()
    meter = ResponseMeter(0.0, 200, "application/json", None)
    meter.feed(body[:5], 0.1)
    meter.feed(body[5:], 0.2)
    assert meter.sample(0.3, broken=False) == Sample(0.3, False, None, None, 2, ("stop",))
    assert ResponseMeter(0.0, 503, "application/json", None).sample(1.0, broken=False).error
    refused = ResponseMeter(0.0, 400, "application/json", None)  # the client's mistake, not the replica's error
    refused.feed(b'{"error": {"message": "prompt too long", "code": 400}}', 0.1)
    assert refused.sample(0.2, broken=False) == Sample(0.2, False)
    broken = ResponseMeter(0.0, 200, "text/event-stream", None)
    broken.feed(b'data: {"error": {"message": "engine died"}}\n\n', 0.1)
    assert broken.sample(0.2, broken=False).error
    assert ResponseMeter(0.0, 200, "text/event-stream", None).sample(0.2, broken=True).error
    gzipped = ResponseMeter(0.0, 200, "application/json", "gzip")
    gzipped.feed(b"\x1f\x8b...", 0.1)
    assert gzipped.sample(0.2, broken=False) == Sample(0.2, False)


def _config(tmp_path, plan: str = "50%:10s,100%", rules: str = "rules: [{metric: mean_output_tokens, min_ratio: 0.8}]"
            "\nmin_samples: 3\nwindow: 5s", **kw) -> CanaryConfig:
    (tmp_path / "rules.yaml").write_text(rules)
    return CanaryConfig.from_args(["http://canary/"], plan, tmp_path / "rules.yaml", 1.0,
                                  audit_log=tmp_path / "audit.jsonl", **kw)


def _feed(canary: Canary, t: float, canary_tokens: int = 40, n: int = 3) -> None:
    for _ in range(n):
        canary.record(CANARY, Sample(t, False, 0.1, 0.01, canary_tokens, ("length",)))
        canary.record(STABLE, Sample(t, False, 0.1, 0.01, 40, ("length",)))


def _audit(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]


def test_a_step_advances_only_after_its_rules_held_for_its_whole_duration(tmp_path):
    canary = Canary(_config(tmp_path), 0.0, CollectorRegistry())
    assert canary.evaluate(1.0)["decision"] == "hold"  # no samples: no verdict, and the clock does not run
    decisions = []
    for t in range(2, 20):
        _feed(canary, t - 0.5)
        decisions.append(canary.evaluate(float(t))["decision"])
        if not canary.running:
            break
    # the clock starts at the first passing evaluation (t=1 held nothing): 10 s of held rules are reached at t=11
    assert decisions == ["continue"] * 9 + ["done"]
    assert canary.status()["phase"] == "done" and canary.state.weight == 1.0
    assert [r["decision"] for r in _audit(tmp_path)] == ["start", "hold"] + decisions
    done = _audit(tmp_path)[-1]
    assert done["weight"] == 0.5 and done["next_weight"] == 1.0
    assert done["sides"]["canary"]["mean_output_tokens"] == 40.0
    assert done["rules"][0] == {"metric": "mean_output_tokens", "source": "proxy", "min_ratio": 0.8, "canary": 40.0,
                                "stable": 40.0, "limit": 32.0, "samples": {"canary": 15, "stable": 15},
                                "verdict": "held"}
    # no backend was scraped: recorded as such, and no rule read it
    assert done["backend"] == {"canary": {"no_data": "http://canary: not scraped yet"},
                               "stable": {"no_data": "no backend on this side"}}


def test_a_broken_rule_rolls_back_at_once_and_the_canary_gets_nothing_after(tmp_path):
    canary = Canary(_config(tmp_path), 0.0, CollectorRegistry())
    _feed(canary, 0.5)
    assert canary.evaluate(1.0)["decision"] == "continue"
    _feed(canary, 1.5, canary_tokens=10)
    record = canary.evaluate(2.0)
    assert record["decision"] == "rollback" and record["next_weight"] == 0.0
    assert "mean_output_tokens: canary 25 < limit 32" in record["reason"]
    assert canary.status()["phase"] == "rolled_back" and canary.status()["reason"] == record["reason"]
    assert {canary.sides(None) for _ in range(20)} == {(STABLE,)}
    assert canary.sides("user-1") == (STABLE,)
    assert _audit(tmp_path)[-1]["decision"] == "rollback"


def test_a_canary_that_cannot_be_judged_or_logged_fails_safe(tmp_path):
    canary = Canary(_config(tmp_path), 0.0, CollectorRegistry())
    canary.audit.close()  # writes now fail as on a full disk: decisions still happen, and say so in the log
    record = canary.fail_safe("ValueError('boom')")
    assert record["decision"] == "rollback" and "evaluation failed" in record["reason"]
    assert canary.status()["phase"] == "rolled_back" and canary.sides(None) == (STABLE,)


def test_the_split_is_exact_and_a_sticky_session_keeps_its_side_as_weights_rise(tmp_path):
    canary = Canary(_config(tmp_path, plan="20%:1s,60%:1s,100%", sticky_header="X-Session-Id"), 0.0,
                    CollectorRegistry())
    assert [canary.sides(None)[0] for _ in range(10)].count(CANARY) == 2
    users = [f"user-{i}" for i in range(200)]
    before = {u: canary.sides(u)[0] for u in users}
    assert before == {u: canary.sides(u)[0] for u in users}  # same value, same side, within the step
    assert 20 <= list(before.values()).count(CANARY) <= 60
    _feed(canary, 0.5)
    assert canary.evaluate(1.0)["decision"] == "advance"
    after = {u: canary.sides(u)[0] for u in users}
    assert all(after[u] == CANARY for u in users if before[u] == CANARY)  # nobody moves back to stable
    assert list(after.values()).count(CANARY) > list(before.values()).count(CANARY)


def test_a_canary_without_rules_or_with_a_window_shorter_than_its_evaluations_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="--canary needs --plan .* and --rules"):
        CanaryConfig.from_args(["http://c"], "5%:1h,100%", None, 5.0)
    with pytest.raises(ConfigError, match="window .* is shorter than --eval-interval"):
        _config(tmp_path, rules="rules: [{metric: error_rate, max_increase: 1%}]\nwindow: 500ms")
