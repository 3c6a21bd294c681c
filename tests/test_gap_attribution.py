"""A bench run's long gaps joined with a server's step log (`tally serve --step-log`): each put down to one cause."""
from __future__ import annotations

import json

from tally.bench.gap_attribution import attribute, describe, long_gaps, read_steps, token_times

ORIGIN_S = 1000.0


def _log(*steps: tuple[float, float, int]) -> list[str]:
    """(start, seconds, prompt tokens) → the step log's lines, as the engine writes them."""
    return [json.dumps({"start_s": ORIGIN_S + start, "seconds": seconds, "prompt_tokens": tokens,
                        "chunks": [[tokens, 0]] if tokens else [], "rows": 3, "decode_rows": 2, "preempted": 0,
                        "waiting": 1, "token_budget": None, "predicted_s": 0.1 if tokens else None})
            for start, seconds, tokens in steps]


def _run(*streams: list[float], warmup: bool = False) -> dict:
    """A bench result whose streams received tokens at these times (seconds since the run started)."""
    return {"clock_origin_s": ORIGIN_S, "requests": [
        {"warmup": warmup, "error": None, "first_token_s": t[0], "itl_s": [b - a for a, b in zip(t, t[1:])]}
        for t in streams]}


def test_token_times_are_on_the_host_clock_and_skip_warmup():
    run = _run([1.0, 1.5, 2.25])
    run["requests"].append({"warmup": True, "error": None, "first_token_s": 0.5, "itl_s": [0.1]})
    (times,) = token_times(run)
    assert times == [ORIGIN_S + 1.0, ORIGIN_S + 1.5, ORIGIN_S + 2.25]


def test_a_gap_one_step_covers_is_a_long_step():
    steps = read_steps(_log((0.0, 0.01, 0), (0.01, 0.2, 64), (0.21, 0.01, 0)))
    ends = [s.end_s for s in steps]
    gap = attribute(ORIGIN_S + 0.011, ORIGIN_S + 0.212, steps, ends)
    assert gap.cause == "long step" and gap.step.prompt_tokens == 64 and gap.steps_ended == 1


def test_a_gap_over_several_short_steps_is_steps_sat_out():
    steps = read_steps(_log(*[(0.01 * i, 0.01, 0) for i in range(10)]))
    gap = attribute(ORIGIN_S + 0.0105, ORIGIN_S + 0.0505, steps, [s.end_s for s in steps])
    assert gap.cause == "sat out steps" and gap.steps_ended == 4


def test_a_token_that_comes_long_after_its_step_is_delivery():
    steps = read_steps(_log((0.0, 0.01, 0), (0.01, 0.01, 0)))
    gap = attribute(ORIGIN_S + 0.011, ORIGIN_S + 0.1, steps, [s.end_s for s in steps])
    assert gap.cause == "delivery" and abs(gap.delivery_s - 0.08) < 1e-9


def test_a_gap_without_steps_running_is_between_steps():
    steps = read_steps(_log((0.0, 0.01, 0), (0.09, 0.01, 0)))
    gap = attribute(ORIGIN_S + 0.011, ORIGIN_S + 0.1005, steps, [s.end_s for s in steps])
    assert gap.cause == "between steps"


def test_only_gaps_over_the_multiple_of_the_median_are_attributed():
    steps = read_steps(_log(*[(0.01 * i, 0.01, 0) for i in range(5)], (0.05, 0.1, 32), (0.15, 0.01, 0)))
    run = _run([0.0101, 0.0201, 0.0301, 0.0401, 0.0501, 0.1501, 0.1601])
    median_s, gaps = long_gaps(run, steps, 3.0)
    assert abs(median_s - 0.01) < 1e-9
    assert [g.cause for g in gaps] == ["long step"]
    lines = describe(median_s, gaps, steps, 3.0)
    assert lines[0].startswith("gaps > 3x the median (10 ms): 1")
    assert any(line.startswith("steps: with prompt tokens 1") for line in lines)
