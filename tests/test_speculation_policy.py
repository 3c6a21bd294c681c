"""The adaptive policy keeps speculation on only where it measured more tokens per second with it than without,
re-measures as the load changes,, and verifies every proposal while on."""
from __future__ import annotations

from tally.engine.speculation_policy import EPOCH_STEPS, EXPLOIT_EPOCHS, SpeculationPolicy


def _epoch(policy: SpeculationPolicy, tokens_per_step: int, seconds_per_step: float, batch: int = 4) -> None:
    for _ in range(EPOCH_STEPS):
        policy.observe_step(tokens_per_step, seconds_per_step, batch)


def _run(off_rate: float, on_rate: float) -> SpeculationPolicy:
    """An off epoch, then an on epoch, at the given tokens/s."""
    policy = SpeculationPolicy()
    assert not policy.speculate_now()  # off is measured first
    _epoch(policy, 10, 10 / off_rate)
    assert policy.speculate_now()
    _epoch(policy, 10, 10 / on_rate)
    return policy


def test_speculation_stays_on_where_it_measured_faster_and_off_where_not():
    assert _run(off_rate=100, on_rate=250).speculate_now()
    assert not _run(off_rate=100, on_rate=90).speculate_now()
    assert not _run(off_rate=100, on_rate=101).speculate_now()  # a tie is not worth the rows


def test_the_choice_is_measured_again_after_a_while():
    policy = _run(off_rate=100, on_rate=250)
    for _ in range(EXPLOIT_EPOCHS):
        assert policy.speculate_now()
        _epoch(policy, 10, 0.04)
    assert not policy.speculate_now()  # measuring off again


def test_a_different_load_is_measured_again_at_once():
    policy = _run(off_rate=100, on_rate=250)  # measured at 4 running requests
    policy.observe_step(10, 0.04, 5)
    assert policy.speculate_now()
    policy.observe_step(10, 0.04, 32)  # eight times the batch: what held at 4 says nothing here
    assert not policy.speculate_now()


def test_while_on_every_proposal_is_verified_and_while_off_none():
    assert _run(off_rate=100, on_rate=250).choose([4, 2, 1]) == [4, 2, 1]
    assert _run(off_rate=100, on_rate=90).choose([4, 2, 1]) == [0, 0, 0]
