"""The one table of metric names and the one /metrics reader: the server serves every catalogued name under either
prefix, a reader finds a series under vLLM's older name when that is all a server serves, and what changed between
two reads counts a restarted server from zero, never below it."""
from __future__ import annotations

import pytest

from tally import metric_names as names
from tally.engine.snapshot import EngineSnapshot
from tally.engine.speculation.policy import Counters
from tally.engine.speculation.stats import SpeculationStats
from tally.prometheus_text import Exposition, counter_increase, histogram_delta, histogram_increase, increase, parse
from tally.server.metrics import ServerMetrics

SERVED = {  # what the server serves of the catalogue, by kind (a counter's family has no _total)
    "gauges": (names.NUM_REQUESTS_RUNNING, names.NUM_REQUESTS_WAITING, names.KV_CACHE_USAGE_PERC,
               names.KV_CACHE_FRAGMENTATION_PERC),
    "counters": (names.NUM_PREEMPTIONS, names.SPEC_DECODE_NUM_DRAFTS, names.SPEC_DECODE_NUM_DRAFT_TOKENS,
                 names.SPEC_DECODE_NUM_ACCEPTED_TOKENS, names.REQUEST_SUCCESS, names.REQUEST_REJECTED,
                 names.REQUEST_TIMEOUT, names.REQUEST_ERROR, names.DECODE_STEP_SECONDS, names.DECODE_STEP_TOKENS,
                 names.SPEC_DECODE_POLICY_STEPS, names.SPEC_DECODE_POLICY_MEASURING_STEPS,
                 names.SPEC_DECODE_POLICY_SPECULATING_STEPS, names.SPEC_DECODE_POLICY_LOST_OFF_STEPS),
    "histograms": (names.TIME_TO_FIRST_TOKEN_SECONDS, names.INTER_TOKEN_LATENCY_SECONDS,
                   names.REQUEST_TIME_PER_OUTPUT_TOKEN_SECONDS, names.E2E_REQUEST_LATENCY_SECONDS,
                   names.REQUEST_QUEUE_TIME_SECONDS, names.REQUEST_GENERATION_TOKENS),
}


def _server(prefix: str) -> Exposition:
    snapshot = EngineSnapshot(num_blocks=10, num_used_blocks=4, speculation=SpeculationStats(),
                              speculation_policy=Counters())
    return parse(ServerMetrics("m", lambda: snapshot, prefix).render().decode())


def _histogram(name: str, count: int, total: float, le_01: int | None = None) -> str:
    return (f"# TYPE {name} histogram\n{name}_bucket{{le=\"0.1\"}} {count if le_01 is None else le_01}\n"
            f"{name}_bucket{{le=\"+Inf\"}} {count}\n{name}_sum {total}\n{name}_count {count}\n")


@pytest.mark.parametrize("flag", sorted(names.METRICS_PREFIXES))
def test_the_server_serves_every_catalogued_name_under_either_prefix(flag):
    served = _server(names.METRICS_PREFIXES[flag])
    assert served.prefix == names.METRICS_PREFIXES[flag]
    for kind, catalogued in SERVED.items():
        assert set(catalogued) <= set(getattr(served, kind)), kind
    assert served.gauge(names.KV_CACHE_USAGE_PERC) == 0.4


def test_under_vllm_the_server_serves_vllms_older_names_too_and_readers_prefer_the_current_ones():
    served = _server(names.METRICS_PREFIXES["vllm"])
    assert names.GPU_CACHE_USAGE_PERC in served.gauges
    assert names.TIME_PER_OUTPUT_TOKEN_SECONDS in served.histograms  # the per-token gap, as vLLM renamed it
    assert served.served_as(served.histograms, names.REQUEST_TIME_PER_OUTPUT_TOKEN_SECONDS) == \
        names.REQUEST_TIME_PER_OUTPUT_TOKEN_SECONDS
    assert names.GPU_CACHE_USAGE_PERC not in _server(names.METRICS_PREFIXES["tally"]).gauges


def test_an_older_vllms_names_are_read_as_the_current_ones():
    old = parse('# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{model_name="a"} 0.2\n'
                'vllm:gpu_cache_usage_perc{model_name="b"} 0.4\n'
                + _histogram("vllm:time_per_output_token_seconds", 5, 0.25))
    assert old.prefix == "vllm:"
    assert old.gauge(names.KV_CACHE_USAGE_PERC) == pytest.approx(0.3)  # the mean over label sets
    assert old.histogram(names.REQUEST_TIME_PER_OUTPUT_TOKEN_SECONDS).count == 5
    assert old.histogram(names.INTER_TOKEN_LATENCY_SECONDS) is None
    assert names.spellings(names.NUM_REQUESTS_WAITING) == (names.NUM_REQUESTS_WAITING,)


def test_one_prefix_is_read_and_unprefixed_series_are_kept():
    text = ("# TYPE tally:num_requests_waiting gauge\ntally:num_requests_waiting 3\n"
            "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 7\n"
            "# TYPE http_requests_total counter\nhttp_requests_total{handler=\"/v1/chat/completions\"} 9\n")
    read = parse(text)
    assert read.prefix == "tally:" and read.gauge(names.NUM_REQUESTS_WAITING) == 3
    assert read.counters[names.HTTP_REQUESTS] == [({"handler": "/v1/chat/completions"}, 9.0)]
    assert parse("# TYPE up gauge\nup 1\n").prefix is None
    with pytest.raises(ValueError):
        parse("<html>not found</html>")


def test_a_histogram_delta_is_what_was_observed_between_two_reads():
    name = "vllm:request_queue_time_seconds"
    before, after = parse(_histogram(name, 10, 0.2)), parse(_histogram(name, 30, 1.0))
    delta = histogram_delta(before, after, names.REQUEST_QUEUE_TIME_SECONDS)
    assert delta["count"] == 20 and delta["mean"] == pytest.approx(0.04) and 0 < delta["p50"] <= 0.1
    assert histogram_delta(after, after, names.REQUEST_QUEUE_TIME_SECONDS) is None  # nothing observed
    assert histogram_delta(None, after, names.TIME_TO_FIRST_TOKEN_SECONDS) is None  # not served
    assert histogram_delta(None, after, names.REQUEST_QUEUE_TIME_SECONDS)["count"] == 30  # since the start


def test_a_counter_that_went_down_counts_from_zero():
    assert increase(10.0, 25.0) == 15.0 and increase(100.0, 4.0) == 4.0

    def read(stop: int, length: int) -> Exposition:
        return parse(f"# TYPE tally:request_success_total counter\n"
                     f"tally:request_success_total{{finished_reason=\"stop\"}} {stop}\n"
                     f"tally:request_success_total{{finished_reason=\"length\"}} {length}\n")

    assert counter_increase(read(10, 5), read(30, 7), names.REQUEST_SUCCESS) == 22.0
    assert counter_increase(read(100, 50), read(3, 1), names.REQUEST_SUCCESS) == 4.0  # restarted
    assert counter_increase(read(10, 5), read(30, 7), names.REQUEST_SUCCESS,
                            lambda labels: labels["finished_reason"] == "length") == 2.0
    assert counter_increase(None, read(3, 1), names.REQUEST_SUCCESS) == 4.0
    assert counter_increase(read(1, 1), read(2, 2), names.REQUEST_ERROR) is None  # not served


def test_a_histogram_that_went_down_counts_from_zero():
    name = "tally:time_to_first_token_seconds"
    before, restarted = parse(_histogram(name, 100, 5.0)), parse(_histogram(name, 4, 0.2, le_01=3))
    observed = histogram_increase(before, restarted, names.TIME_TO_FIRST_TOKEN_SECONDS)
    assert (observed.count, observed.sum, observed.buckets) == (4, 0.2, {0.1: 3, float("inf"): 4})
