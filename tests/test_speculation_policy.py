"""The adaptive policy verifies proposals only where they raise expected tokens per second, from measured
acceptance and measured step cost."""
from __future__ import annotations

from tally.engine.speculation_policy import EXPLORE_EVERY, Acceptance, SpeculationPolicy


def _policy(fixed_s: float, per_token_s: float, per_row_s: float = 0.0) -> SpeculationPolicy:
    policy = SpeculationPolicy()
    for tokens, rows in ((1, 0), (5, 1), (3, 1), (8, 2), (2, 0), (12, 3), (6, 1), (9, 2), (4, 0), (16, 4)):
        policy.observe_step(tokens, rows, fixed_s + per_token_s * tokens + per_row_s * rows)
    return policy


def _choose(policy: SpeculationPolicy, decoding: int, proposals: list[tuple[int, float]]) -> list[int]:
    policy._num_choices = 1  # not an exploring step
    return policy.choose(decoding, proposals)


def test_cheap_rows_and_good_proposals_verify_everything():
    """One CPU decode step reads every weight once: 4 more rows cost little beside it."""
    policy = _policy(0.050, 0.001)
    assert _choose(policy, 1, [(4, 0.8)]) == [4]


def test_rows_as_dear_as_a_step_verify_nothing():
    """At high concurrency a step is compute-bound: each row costs what a token is worth."""
    policy = _policy(0.002, 0.004)
    assert _choose(policy, 32, [(4, 0.6)] * 32) == [0] * 32


def test_poor_acceptance_is_not_worth_its_rows():
    policy = _policy(0.050, 0.004, per_row_s=0.005)
    assert _choose(policy, 1, [(4, 0.05)]) == [0]
    assert _choose(policy, 1, [(4, 0.9)])[0] >= 2


def test_proposals_are_taken_by_expected_gain_first():
    policy = _policy(0.050, 0.006)
    good, poor = _choose(policy, 2, [(4, 0.9), (4, 0.3)])
    assert good > poor


def test_every_proposal_is_verified_until_the_cost_is_known_and_on_exploring_steps():
    policy = SpeculationPolicy()
    assert policy.choose(1, [(3, 0.0)]) == [3]  # nothing measured yet
    policy = _policy(0.002, 0.004)
    policy._num_choices = EXPLORE_EVERY - 1
    assert policy.choose(1, [(3, 0.0)]) == [3]


def test_acceptance_counts_only_the_positions_that_were_judged():
    policy = SpeculationPolicy()
    a = Acceptance()
    policy.observe_verified(a, proposed=4, accepted=1)  # positions 0 (held) and 1 (rejected); 2, 3 never judged
    assert (a.accepted, a.verified) == (1, 2)
    policy.observe_verified(a, proposed=4, accepted=4)
    assert (a.accepted, a.verified) == (5, 6)
    assert 0.5 < policy.acceptance_rate(a) < 5 / 6 + 1e-9
