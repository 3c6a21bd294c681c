"""The canary's second source without servers: a backend's /metrics text (Tally's own ServerMetrics, under either
prefix, and a vLLM-shaped exposition) is parsed with prometheus_client's parser, differenced over a window, and
turned into the figures the rules read; the controller judges `source: backend` rules on them, records both
sources in the audit log, and holds (never advances) when a backend has no /metrics."""
from __future__ import annotations

import json

import pytest
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from tally.engine.snapshot import EngineSnapshot
from tally.ops.backend_metrics import BackendScrapes, delta, parse_scrape, side_figures
from tally.ops.canary import CANARY, STABLE, Canary, CanaryConfig
from tally.ops.canary_rules import (
    BROKEN,
    HELD,
    NO_DATA,
    TOO_FEW,
    CanaryRules,
    Rule,
    Sample,
    figures,
    judge,
)
from tally.server.metrics import TIME_BUCKETS_S, TOKEN_BUCKETS, ServerMetrics

CHAT = "/v1/chat/completions"


class TallyBackend:
    """A Tally server's /metrics as the server itself renders it (tally/server/metrics.py), fed by hand."""

    def __init__(self, prefix: str = "tally:") -> None:
        self.preemptions, self.kv_used = 0, 0
        self.metrics = ServerMetrics("tiny", lambda: EngineSnapshot(
            num_preemptions=self.preemptions, num_blocks=10, num_used_blocks=self.kv_used), prefix)

    def serve(self, n: int, ttft_s: float = 0.05, tpot_s: float = 0.01, tokens: int = 40, reason: str = "stop",
              errors: int = 0, rejected: int = 0, timeouts: int = 0, bad_requests: int = 0) -> TallyBackend:
        m = self.metrics
        for _ in range(n):
            m.ttft.labels("tiny", CHAT).observe(ttft_s)
            m.tpot.labels("tiny", CHAT).observe(tpot_s)
            m.generation_tokens.labels("tiny", CHAT).observe(tokens)
            m.count_success(CHAT, reason)
        for _ in range(errors):
            m.count_error(CHAT, 500)
        for _ in range(rejected):
            m.count_rejected(CHAT, "queue_full")
        for _ in range(timeouts):
            m.count_timeout(CHAT)
        for _ in range(bad_requests):  # a client's mistake (400) is not the server's error
            m.count_error(CHAT, 400)
        return self

    def text(self) -> str:
        return self.metrics.render().decode()


class VllmBackend:
    """vLLM's names: no error counter under vllm:, the API server's http_requests_total when instrumented."""

    def __init__(self, http_counter: bool = True, old_names: bool = False) -> None:
        r = self.registry = CollectorRegistry()
        labels = ["model_name"]
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "", labels, buckets=TIME_BUCKETS_S, registry=r)
        tpot = "vllm:time_per_output_token_seconds" if old_names else "vllm:request_time_per_output_token_seconds"
        self.tpot = Histogram(tpot, "", labels, buckets=TIME_BUCKETS_S, registry=r)
        self.tokens = Histogram("vllm:request_generation_tokens", "", labels, buckets=TOKEN_BUCKETS, registry=r)
        self.success = Counter("vllm:request_success", "", labels + ["finished_reason"], registry=r)
        self.preemptions = Counter("vllm:num_preemptions", "", labels, registry=r)
        kv = "vllm:gpu_cache_usage_perc" if old_names else "vllm:kv_cache_usage_perc"
        self.kv = Gauge(kv, "", labels, registry=r)
        self.http = Counter("http_requests", "", ["handler", "method", "status"], registry=r) if http_counter \
            else None

    def serve(self, n: int, ttft_s: float = 0.05, tokens: int = 40, reason: str = "stop", errors: int = 0) \
            -> VllmBackend:
        for _ in range(n):
            self.ttft.labels("m").observe(ttft_s)
            self.tpot.labels("m").observe(0.01)
            self.tokens.labels("m").observe(tokens)
            self.success.labels("m", reason).inc()
            if self.http:
                self.http.labels(CHAT, "POST", "2xx").inc()
        if self.http:
            self.http.labels(CHAT, "POST", "5xx").inc(errors)
            self.http.labels("/metrics", "GET", "5xx").inc(7)  # not a generation: not counted
        self.preemptions.labels("m").inc(2)
        self.kv.labels("m").set(0.25)
        return self

    def text(self) -> str:
        return generate_latest(self.registry).decode()


def _window(backend, before: int, during: dict, t0: float = 0.0, t1: float = 10.0):
    """Scrapes at t0 (after `before` plain requests) and t1 (after `during`), as one backend's delta."""
    backend.serve(before)
    first = parse_scrape(backend.text(), t0)
    backend.serve(**during)
    return delta(first, parse_scrape(backend.text(), t1))


@pytest.mark.parametrize("prefix", ["tally:", "vllm:"])  # a Tally server under --metrics-prefix vllm reads the same
def test_a_tally_servers_metrics_give_the_window_not_the_whole_life(prefix):
    backend = TallyBackend(prefix)
    d = _window(backend, 50, dict(n=40, ttft_s=0.3, tokens=12, reason="length", errors=2, rejected=1, timeouts=1,
                                  bad_requests=5))
    backend.preemptions, backend.kv_used = 3, 4
    f = side_figures({"http://a": d}, {})
    assert (f.prefix, f.replicas, f.unexposed, f.window_s) == (prefix, ("http://a",), (), 10.0)
    # only the window's 40 requests: not the 50 before, whose TTFT was 50 ms and tokens 40
    assert (f.ttft_samples, f.tpot_samples, f.output_samples) == (40, 40, 40)
    assert 0.2 < f.ttft_p99_s <= 0.3  # interpolated inside the (0.2, 0.3] bucket
    assert f.mean_output_tokens == 12.0 and f.length_share == 1.0 and f.finished_choices == 40
    # 5xx, rejections and timeouts are errors; a 400 is the client's
    assert (f.requests, f.errors) == (44, 4) and f.error_rate == pytest.approx(4 / 44)


def test_a_vllm_servers_metrics_are_read_with_its_names():
    d = _window(VllmBackend(), 10, dict(n=30, ttft_s=0.07, tokens=20, reason="length", errors=3))
    f = side_figures({"http://v": d}, {})
    assert f.prefix == "vllm:" and f.unexposed == ()
    assert (f.requests, f.errors, f.mean_output_tokens, f.length_share) == (33, 3, 20.0, 1.0)
    assert f.preemptions == 2 and f.kv_usage == 0.25 and 0.06 < f.ttft_p99_s <= 0.08
    old = side_figures({"http://v": _window(VllmBackend(http_counter=False, old_names=True), 0, dict(n=5))}, {})
    assert old.unexposed == ("error_rate",) and old.error_rate is None  # unknown, not zero
    assert old.tpot_samples == 5 and old.kv_usage == 0.25


def test_a_side_of_several_backends_is_their_sum():
    a = _window(TallyBackend(), 0, dict(n=30, ttft_s=0.01, tokens=10))
    b = _window(TallyBackend(), 0, dict(n=10, ttft_s=2.0, tokens=50, reason="length"))
    f = side_figures({"http://a": a, "http://b": b}, {"http://c": "/metrics answered 404"})
    assert (f.requests, f.ttft_samples, f.mean_output_tokens, f.length_share) == (40, 40, 20.0, 0.25)
    assert 1.5 < f.ttft_p99_s <= 2.5 and f.missing == {"http://c": "/metrics answered 404"}


def test_a_restarted_backend_counts_from_zero():
    backend = TallyBackend().serve(100, tokens=90)
    first = parse_scrape(backend.text(), 0.0)
    restarted = TallyBackend().serve(5, tokens=10)  # counters below the first scrape's
    f = side_figures({"u": delta(first, parse_scrape(restarted.text(), 5.0))}, {})
    assert (f.requests, f.output_samples, f.mean_output_tokens) == (5, 5, 10.0)


@pytest.mark.parametrize("text, says", [
    ("# HELP up x\n# TYPE up gauge\nup 1\nprocess_cpu_seconds_total 3\n", "no tally: or vllm: series"),
    ("<html>not found</html>", "not Prometheus' text format"),
])
def test_a_metrics_page_that_is_not_a_tally_or_vllm_servers_is_refused(text, says):
    with pytest.raises(ValueError, match=says):
        parse_scrape(text, 0.0)


def test_scrapes_are_kept_for_the_window_and_a_side_without_metrics_has_no_data():
    scrapes = BackendScrapes({CANARY: ("http://c",), STABLE: ("http://s", "http://plain")}, keep_s=30.0)
    stable = TallyBackend()
    for t in range(0, 50, 5):
        scrapes.add("http://s", float(t), stable.serve(3).text())
        scrapes.add("http://c", float(t), "not metrics {")
        scrapes.fail("http://plain", "/metrics answered 404 (not a Tally or vLLM server?)")
    assert [s.t_s for s in scrapes.history["http://s"]] == [15.0, 20.0, 25.0, 30.0, 35.0, 40.0, 45.0]
    side = scrapes.side(STABLE, since_s=32.0, now_s=50.0)  # the first scrape inside the window is its start
    assert side.window_s == 10.0 and side.requests == 6 and side.missing == {  # 35 s to 45 s
        "http://plain": "/metrics answered 404 (not a Tally or vLLM server?)"}
    assert [s.t_s for s in scrapes.history["http://s"]] == [35.0, 40.0, 45.0]
    assert "not Prometheus' text format" in scrapes.side(CANARY, 32.0, 50.0)
    assert "fewer than two scrapes" in scrapes.side(STABLE, since_s=44.0, now_s=50.0)


def _proxy(n: int = 30) -> list[Sample]:
    return [Sample(0.0, False, 0.05, 0.01, 40, ("stop",)) for _ in range(n)]


def test_backend_rules_read_the_backend_and_say_when_there_is_none():
    rules = CanaryRules((Rule("mean_output_tokens", 0.8, "backend"), Rule("error_rate", 0.01, "backend"),
                         Rule("ttft_p99", 1.5, "backend"), Rule("mean_output_tokens", 0.8)), min_samples=20)
    short = side_figures({"c": _window(TallyBackend(), 0, dict(n=30, tokens=10))}, {})
    full = side_figures({"s": _window(TallyBackend(), 0, dict(n=30, tokens=40))}, {})
    verdicts = [v.verdict for v in judge(rules, figures(_proxy()), figures(_proxy()), (short, full))]
    assert verdicts == [BROKEN, HELD, HELD, HELD]  # the proxy saw 40 tokens from both: only the backends differ
    few = side_figures({"c": _window(TallyBackend(), 0, dict(n=5))}, {})
    assert judge(rules, figures(_proxy()), figures(_proxy()), (few, full))[0].verdict == TOO_FEW
    vllm = side_figures({"v": _window(VllmBackend(http_counter=False), 0, dict(n=30))}, {})
    judged = judge(rules, figures(_proxy()), figures(_proxy()), (vllm, full))
    assert [v.verdict for v in judged] == [HELD, NO_DATA, HELD, HELD]
    assert judged[1].explain() == ("error_rate (backend): no data (canary: its /metrics (vllm:) has no series for "
                                   "error_rate)")
    nothing = judge(rules, figures(_proxy()), figures(_proxy()), ("http://c: /metrics answered 404", full))
    assert [v.verdict for v in nothing] == [NO_DATA] * 3 + [HELD]
    assert nothing[0].explain() == "mean_output_tokens (backend): no data (canary: http://c: /metrics answered 404)"


def _canary(tmp_path, rules: str) -> Canary:
    (tmp_path / "rules.yaml").write_text(rules)
    config = CanaryConfig.from_args(["http://c"], "50%:3s,100%", tmp_path / "rules.yaml", 1.0,
                                    audit_log=tmp_path / "audit.jsonl")
    return Canary(config, 0.0, CollectorRegistry(), stable_urls=("http://s/",))


def _audit(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]


def _turn(canary: Canary, t: float, backends: dict[str, TallyBackend | None], n: int = 4, **serve) -> dict:
    """One second: n requests seen by the proxy on each side, each backend serves them, is scraped, evaluated."""
    for _ in range(n):
        canary.record(CANARY, Sample(t - 0.5, False, 0.05, 0.01, 40, ("stop",)))
        canary.record(STABLE, Sample(t - 0.5, False, 0.05, 0.01, 40, ("stop",)))
    for url, backend in backends.items():
        if backend is None:
            canary.backends.fail(url, "/metrics answered 404 (not a Tally or vLLM server?)")
        else:
            canary.backends.add(url, t - 0.1, backend.serve(n, **(serve if url == "http://c" else {})).text())
    return canary.evaluate(t)


BOTH = """\
min_samples: 4
window: 2s
rules:
  - {metric: mean_output_tokens, min_ratio: 0.8}
  - {metric: mean_output_tokens, min_ratio: 0.8, source: backend}
"""


def test_a_backend_rule_rolls_back_a_canary_the_proxy_could_not_see_and_the_audit_has_both_sources(tmp_path):
    canary = _canary(tmp_path, BOTH)
    c, s = TallyBackend(), TallyBackend()
    first = _turn(canary, 1.0, {"http://c": c, "http://s": s})
    assert first["decision"] == "hold" and "fewer than two scrapes in the window yet" in first["reason"]
    record = _turn(canary, 2.0, {"http://c": c, "http://s": s}, tokens=10)  # e.g. non-streamed, usage-less answers
    assert record["decision"] == "rollback" and record["next_weight"] == 0.0
    assert record["reason"] == ("mean_output_tokens (backend): canary 10 < limit 32 (min_ratio 0.8, stable 40)")
    record = _audit(tmp_path)[-1]
    assert record["sides"]["canary"]["mean_output_tokens"] == 40.0  # what the proxy saw held
    backend = record["backend"]["canary"]
    assert backend == {
        "requests": 4, "errors": 0, "error_rate": 0.0, "ttft_samples": 4, "ttft_p99_s": backend["ttft_p99_s"],
        "tpot_samples": 4, "tpot_p99_s": backend["tpot_p99_s"], "output_samples": 4, "mean_output_tokens": 10.0,
        "finished_choices": 4, "length_share": 0.0, "window_s": 1.0, "prefix": "tally:", "replicas": ["http://c"],
        "missing": {}, "unexposed": [], "preemptions": 0.0, "kv_usage": 0.0}
    assert 0.04 < backend["ttft_p99_s"] <= 0.06 and 0.005 < backend["tpot_p99_s"] <= 0.01
    assert record["backend"]["stable"]["replicas"] == ["http://s"]
    rules = {(r["metric"], r["source"]): r for r in record["rules"]}
    assert rules[("mean_output_tokens", "backend")]["verdict"] == "broken"
    assert rules[("mean_output_tokens", "proxy")]["verdict"] == "held"
    start = _audit(tmp_path)[0]
    assert start["backends"] == {"canary": ["http://c"], "stable": ["http://s"]}
    assert start["rules"][1] == {"metric": "mean_output_tokens", "source": "backend", "min_ratio": 0.8}


def test_a_canary_without_metrics_holds_on_its_backend_rules_and_never_advances(tmp_path):
    canary = _canary(tmp_path, BOTH)
    s = TallyBackend()
    decisions = [_turn(canary, float(t), {"http://c": None, "http://s": s})["decision"] for t in range(1, 8)]
    assert decisions == ["hold"] * 7 and canary.running and canary.state.weight == 0.5
    last = _audit(tmp_path)[-1]
    assert last["reason"] == ("mean_output_tokens (backend): no data (canary: http://c: /metrics answered 404 (not "
                              "a Tally or vLLM server?))")
    assert last["backend"]["canary"] == {"no_data": "http://c: /metrics answered 404 (not a Tally or vLLM server?)"}
    assert canary.status()["backends"]["http://c"]["problem"].startswith("/metrics answered 404")


def test_without_backend_rules_a_canary_without_metrics_is_judged_by_the_proxy_alone(tmp_path):
    canary = _canary(tmp_path, BOTH.replace("  - {metric: mean_output_tokens, min_ratio: 0.8, source: backend}\n",
                                            ""))
    s = TallyBackend()
    decisions = [_turn(canary, float(t), {"http://c": None, "http://s": s})["decision"] for t in range(1, 4)]
    assert decisions == ["continue", "continue", "done"]
    assert "no_data" in _audit(tmp_path)[-1]["backend"]["canary"]
    assert _audit(tmp_path)[-1]["backend"]["stable"]["prefix"] == "tally:"
