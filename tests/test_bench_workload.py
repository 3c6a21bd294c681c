"""Workload generation of `tally bench`: lengths follow the requested distributions, arrivals
follow the requested rates phase by phase, and a seed pins the whole workload."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tally.bench.arrivals import (
    RateArrivals,
    ReplayArrivals,
    build_schedule,
    parse_phases,
)
from tally.bench.length_samplers import (
    FixedLengths,
    LogNormalLengths,
    TraceLengths,
    fit_lognormal,
    ks_statistic,
    parse_lengths,
)
from tally.bench.workload import RequestPlanner, WorkloadConfig
from tally.errors import ConfigError
from tally.traces import load_trace
from tally.units import parse_duration_s

N = 20_000
KS_CRITICAL = 1.36 / math.sqrt(N)  # alpha 0.05


def _planned_lengths(lengths, n=N, seed=0):
    planner = RequestPlanner(WorkloadConfig(lengths, None, concurrency=1, max_requests=n,
                                            seed=seed))
    requests = [planner.request(i, "") for i in range(n)]
    return (np.array([r.prompt_tokens for r in requests]),
            np.array([r.output_tokens for r in requests]))


def test_lognormal_lengths_pass_ks_test_against_requested_distribution():
    spec = "lognormal:prompt_median=300,prompt_sigma=1.0,output_median=120,output_sigma=0.8"
    sampler = parse_lengths(spec + ",prompt_min=1,prompt_max=10000000,output_max=10000000")
    prompt, output = _planned_lengths(sampler)
    assert ks_statistic(prompt, 300, 1.0) < KS_CRITICAL
    assert ks_statistic(output, 120, 0.8) < KS_CRITICAL


def test_ks_statistic_rejects_a_wrong_distribution():
    prompt, _ = _planned_lengths(LogNormalLengths(prompt_max=10**7))
    assert ks_statistic(prompt, 360, 1.0) > KS_CRITICAL  # median off by 20%
    assert ks_statistic(prompt, 300, 1.3) > KS_CRITICAL  # spread off


def test_lognormal_lengths_are_clipped_to_min_and_max():
    prompt, output = _planned_lengths(parse_lengths(
        "lognormal:prompt_min=50,prompt_max=400,output_min=10,output_max=100"), n=2000)
    assert prompt.min() == 50 and prompt.max() == 400
    assert output.min() == 10 and output.max() == 100


def test_trace_sampling_reproduces_the_trace_percentiles():
    trace = load_trace("conv")
    prompt, output = _planned_lengths(TraceLengths(trace))
    for sampled, real in ((prompt, trace.prompt_tokens), (output, trace.output_tokens)):
        for q in (10, 50, 90, 99):
            want = np.percentile(real, q)
            assert abs(np.percentile(sampled, q) - want) <= 0.08 * want, q


def test_fit_recovers_lognormal_parameters(tmp_path):
    rng = np.random.default_rng(3)
    rows = [{"prompt_tokens": int(p), "completion_tokens": int(o)} for p, o in
            zip(rng.lognormal(math.log(500), 0.7, 5000).round() + 1,
                rng.lognormal(math.log(80), 0.5, 5000).round() + 1)]
    path = tmp_path / "log.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    fit = fit_lognormal(load_trace(str(path)))
    assert fit.prompt_median == pytest.approx(500, rel=0.05)
    assert fit.prompt_sigma == pytest.approx(0.7, rel=0.05)
    assert fit.output_median == pytest.approx(80, rel=0.05)
    assert parse_lengths(fit.spec()) == fit  # the printed spec reproduces the fit


def test_fixed_lengths_are_the_naive_baseline():
    prompt, output = _planned_lengths(parse_lengths("fixed:512,256"), n=100)
    assert set(prompt) == {512} and set(output) == {256}
    assert parse_lengths("fixed:512,256") == FixedLengths(512, 256)


def test_poisson_gaps_have_the_requested_rate_and_unit_cv():
    schedule = build_schedule(RateArrivals(50.0), seed=1, warmup_s=0, duration_s=200,
                              max_requests=None)
    gaps = np.diff(schedule.scheduled_s)
    assert len(schedule.scheduled_s) == pytest.approx(50 * 200, rel=0.05)
    assert gaps.mean() == pytest.approx(1 / 50, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)


def test_burstiness_below_one_gives_burstier_gaps_at_the_same_rate():
    schedule = build_schedule(RateArrivals(50.0, burstiness=0.25), seed=1, warmup_s=0,
                              duration_s=200, max_requests=None)
    gaps = np.diff(schedule.scheduled_s)
    assert gaps.mean() == pytest.approx(1 / 50, rel=0.08)
    assert gaps.std() / gaps.mean() == pytest.approx(2.0, rel=0.1)  # 1/sqrt(0.25)


def test_phase_arrival_counts_and_gaps_match_each_phase_rate():
    phases = parse_phases("5/s:100s,50/s:20s,5/s:100s")
    schedule = build_schedule(RateArrivals(5.0, phases=phases), seed=2, warmup_s=10,
                              duration_s=None, max_requests=None)
    names = np.array(schedule.phase)
    assert [p.name for p in schedule.phases] == ["warmup", "1:5/s", "2:50/s", "3:5/s"]
    for phase in schedule.phases:
        times = schedule.scheduled_s[names == phase.name]
        assert times.min() >= phase.start_s and times.max() < phase.end_s
        expected = phase.rate_per_s * (phase.end_s - phase.start_s)
        assert abs(len(times) - expected) < 4 * math.sqrt(expected), phase.name
        assert np.diff(times).mean() == pytest.approx(1 / phase.rate_per_s, rel=0.2)
    assert np.all(np.diff(schedule.scheduled_s) >= 0)


def test_requests_limit_counts_measured_requests_after_warmup():
    schedule = build_schedule(RateArrivals(20.0), seed=0, warmup_s=2, duration_s=None,
                              max_requests=100)
    assert int((~schedule.warmup).sum()) == 100
    assert np.all(schedule.scheduled_s[schedule.warmup] < 2)


def test_replay_scales_trace_gaps_and_keeps_trace_lengths():
    trace = load_trace("conv")
    config = WorkloadConfig(None, ReplayArrivals(trace.arrival_s, 0.1), duration_s=30,
                            replay_trace=trace)
    requests, _ = RequestPlanner(config).open_loop()
    times = np.array([r.scheduled_s for r in requests])
    expected = trace.arrival_s[trace.arrival_s * 0.1 < 30] * 0.1
    np.testing.assert_allclose(times, expected)
    assert [r.prompt_tokens for r in requests[:50]] == list(trace.prompt_tokens[:50])
    assert [r.output_tokens for r in requests[:50]] == list(trace.output_tokens[:50])


def test_same_seed_gives_the_same_workload_and_another_seed_does_not():
    def plan(seed):
        config = WorkloadConfig(LogNormalLengths(), RateArrivals(10.0, 0.5), duration_s=60,
                                seed=seed, system_prompt_tokens=100, prefix_share=0.5)
        return RequestPlanner(config).open_loop()[0]
    assert plan(7) == plan(7)
    assert plan(7) != plan(8)


def test_prefix_share_is_the_fraction_of_requests_with_the_system_prompt():
    planner = RequestPlanner(WorkloadConfig(LogNormalLengths(), None, concurrency=1,
                                            max_requests=1, prefix_share=0.9))
    shared = [planner.request(i, "").shared_prefix for i in range(5000)]
    assert np.mean(shared) == pytest.approx(0.9, abs=0.02)


def test_requests_are_clipped_to_the_server_context_window():
    planner = RequestPlanner(WorkloadConfig(parse_lengths("fixed:5000,300"), None, concurrency=1,
                                            max_requests=1, max_model_len=2048))
    request = planner.request(0, "")
    assert request.prompt_tokens + request.output_tokens <= 2048


@pytest.mark.parametrize("bad", ["lognormal:prompt_mean=3", "fixed:512", "fixed:a,b",
                                 "uniform:1,2", "trace:/no/such/file.csv"])
def test_bad_length_specs_say_what_to_write(bad):
    with pytest.raises(ConfigError):
        parse_lengths(bad)


def test_durations_and_phases_parse_with_units():
    assert parse_duration_s("100ms") == pytest.approx(0.1)
    assert parse_duration_s("1h") == 3600
    assert parse_phases("5/s:10s,300/m:2s") == ((5.0, 10.0), (5.0, 2.0))
    with pytest.raises(ConfigError):
        parse_phases("5/s")
