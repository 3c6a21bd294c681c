"""The adaptive policy prices a proposal from measured step times (off, then every proposal verified), gives each
request as many proposals as its own acceptance pays for at that price, turns speculation off where following the
price fell below off, measures a load again after a while, and answers a heavier load where speculating did not pay
at a lighter one without measuring."""
from __future__ import annotations

import numpy as np

from tally.core.request import Request
from tally.core.scheduler import ScheduledRequest, SchedulerOutput
from tally.engine.speculation import speculator as speculator_module
from tally.engine.speculation.ngram_proposer import propose_ngram
from tally.engine.speculation.speculator import Speculator
from tally.engine.speculation.policy import (
    CHECK_STEPS,
    EPOCH_STEPS,
    KEEP_STEPS,
    OUTLIER_STEPS,
    RETRY_STEPS,
    SpeculationPolicy,
    proposals_worth_verifying,
    start_repaid,
)
from tally.engine.speculation.config import SpeculativeConfig



def _geometric(alpha: list[float], k: int = 4) -> np.ndarray:
    """Each proposal's worth where every position holds with the same chance: alpha ** j."""
    return np.array(alpha)[:, None] ** np.arange(1, k + 1)


WORTH, LIMITS = _geometric([0.9, 0.5]), np.array([4, 4])


def _steps(policy: SpeculationPolicy, n: int, seconds: float, tokens: int = 4, batch: int = 4,
           proposals: int = 0) -> None:
    for _ in range(n):
        policy.observe_step(tokens, seconds, batch, proposals)


def _priced(on_seconds: float, batch: int = 4, policy: SpeculationPolicy | None = None) -> SpeculationPolicy:
    """Off: 4 tokens per 0.1 s step (40 tokens/s); on: 8 proposals per step, each step `on_seconds`."""
    policy = policy or SpeculationPolicy()
    assert not policy.speculate_now()  # off is measured first
    _steps(policy, EPOCH_STEPS, 0.1, batch=batch)
    assert policy.speculate_now()
    assert policy.choose(WORTH, LIMITS).tolist() == [4, 4]  # measuring: every proposal verified (fixed K)
    _steps(policy, EPOCH_STEPS, on_seconds, tokens=12, batch=batch, proposals=8)
    return policy


def test_each_proposal_is_verified_while_its_expected_worth_meets_its_price():
    # 1.25 ms a proposal at 40 tokens/s: theta 0.05, every proposal of both requests pays
    assert _priced(on_seconds=0.11).choose(WORTH, LIMITS).tolist() == [4, 4]
    # 12.5 ms a proposal: theta 0.5; 0.9^4 = 0.66 pays, 0.5^2 = 0.25 does not
    assert _priced(on_seconds=0.2).choose(WORTH, LIMITS).tolist() == [4, 1]
    # 50 ms a proposal: theta 2, no guess is worth it: nothing is proposed
    assert _priced(on_seconds=0.5).choose(WORTH, LIMITS).tolist() == [0, 0]


def test_a_request_the_draft_must_first_catch_up_on_starts_only_where_its_remaining_tokens_repay_that():
    policy = _priced(on_seconds=0.11)  # theta 0.05 at 40 tokens/s: every proposal pays once started
    worth, limits = _geometric([0.9, 0.9, 0.9]), np.array([4, 4, 4])
    # 0.5 s of catch-up is 20 tokens' worth; E = 0.9 + ... + 0.9^4 = 3.1 tokens a step, 2.9 net: a request with
    # 64 tokens to go makes 15.6 steps, 45 tokens gained; with 16 to go, 11; one already current costs nothing
    starts, remaining = np.array([0.5, 0.5, 0.0]), np.array([64.0, 16.0, 16.0])
    assert policy.choose(worth, limits, starts, remaining).tolist() == [4, 0, 4]
    assert start_repaid(worth, np.array([0, 0, 0]), 0.05, np.array([1.0, 1.0, 0.0]),
                        np.array([1e6, 1e6, 1e6])).tolist() == [False, False, True]  # no proposal repays anything


def test_a_draft_catching_up_while_a_price_is_measured_does_not_raise_the_price_of_a_proposal():
    """The catch-up is what starting on a request costs, charged to that request (start_repaid) before it starts;
    counted in the measuring epoch's steps it would price every later proposal as dear as a start."""
    caught_up = SpeculationPolicy()
    _steps(caught_up, EPOCH_STEPS, 0.1)
    for _ in range(EPOCH_STEPS):  # 0.11 s of proposals, and 0.4 s catching up on new requests
        caught_up.observe_step(12, 0.51, 4, 8, catch_up_seconds=0.4)
    assert caught_up.choose(WORTH, LIMITS).tolist() == _priced(on_seconds=0.11).choose(WORTH, LIMITS).tolist()
    assert _priced(on_seconds=0.51).choose(WORTH, LIMITS).tolist() == [0, 0]  # what counting it would have done


def test_measuring_another_load_starts_only_what_the_last_price_repays_and_waits_for_proposals():
    policy = _priced(on_seconds=0.11)  # a price at 4 requests
    _steps(policy, KEEP_STEPS, 0.1, tokens=8, proposals=8)  # it expires: the load is measured again
    _steps(policy, EPOCH_STEPS, 0.1)  # off
    assert policy.speculate_now()
    worth, limits = _geometric([0.9, 0.9]), np.array([4, 4])
    starts, remaining = np.array([0.5, 0.0]), np.array([16.0, 16.0])
    assert policy.choose(worth, limits, starts, remaining).tolist() == [0, 4]  # the fresh one does not repay
    assert policy.choose(worth, limits).tolist() == [4, 4]  # prompt lookup: nothing to start
    _steps(policy, EPOCH_STEPS, 0.1)  # steps without proposals are off steps: the "on" epoch has not begun
    assert policy.speculate_now() and policy.choose(worth, limits, starts, remaining).tolist() == [0, 4]
    _steps(policy, EPOCH_STEPS, 0.3, tokens=6, proposals=8)  # 25 ms a proposal at 40 tokens/s: theta 1
    assert policy.choose(worth, limits).tolist() == [0, 0]


def test_proposals_worth_verifying():
    worth, limits = _geometric([0.95, 0.8, 0.5, 0.0, 1.0]), np.array([4, 4, 4, 4, 3])
    assert proposals_worth_verifying(worth, limits, 0.0).tolist() == [4, 4, 4, 4, 3]  # rows cost nothing
    assert proposals_worth_verifying(worth, limits, 0.6).tolist() == [4, 2, 0, 0, 3]  # 0.8^2 = 0.64 >= 0.6 > 0.8^3
    assert proposals_worth_verifying(worth, limits, 1.5).tolist() == [0, 0, 0, 0, 0]


def test_speculation_stops_where_following_the_price_fell_below_off():
    policy = _priced(on_seconds=0.11)
    _steps(policy, CHECK_STEPS, 0.1, tokens=3, proposals=8)  # 30 tokens/s: below off's 40
    assert not policy.speculate_now() and policy.choose(WORTH, LIMITS).tolist() == [0, 0]
    policy = _priced(on_seconds=0.11)
    _steps(policy, CHECK_STEPS, 0.1, tokens=6, proposals=8)  # 60 tokens/s
    assert policy.speculate_now()


def test_steps_that_slowed_for_their_own_reasons_are_not_taken_for_speculation_losing():
    """One stream's steps slow as its context grows: 30 tokens/s is below the 40 off made when the price was
    measured, but these 0.2 s steps would have taken 0.19 s without their proposals (1.25 ms each): 21 tokens/s."""
    policy = _priced(on_seconds=0.11)
    _steps(policy, CHECK_STEPS, 0.2, tokens=6, proposals=8)
    assert policy.speculate_now()
    policy = _priced(on_seconds=0.5)  # theta 2: no proposal is worth its price, and none costs anything
    _steps(policy, CHECK_STEPS, 0.1, tokens=4)
    assert policy.speculate_now() and policy.choose(WORTH, LIMITS).tolist() == [0, 0]


def test_the_price_is_measured_again_after_a_while():
    policy = _priced(on_seconds=0.11)
    _steps(policy, KEEP_STEPS - 1, 0.1, tokens=6, proposals=8)
    assert policy.speculate_now()
    _steps(policy, 1, 0.1, tokens=6, proposals=8)
    assert not policy.speculate_now()  # measuring off again


def test_a_price_that_did_not_pay_is_measured_again_soon_then_ever_later():
    """One noisy epoch must not keep speculation off for good, and a load where it truly loses is measured ever
    more rarely: after RETRY_STEPS doubling, or after the steps that make what the failure lost 1% of their time,
    whichever is longer."""
    policy = _priced(on_seconds=0.11)
    # 24 steps of 0.10205 s for 4 tokens: 39.2 tokens/s, 2% below off's 40; 49.2 ms lost, 1% of 50 steps of 0.1 s
    for failures, hold in ((1, 50), (2, 2 * RETRY_STEPS), (3, 4 * RETRY_STEPS)):
        _steps(policy, CHECK_STEPS, 0.10205, tokens=4, proposals=8)  # below off: off from here
        _steps(policy, hold + EPOCH_STEPS - 1, 0.1)
        assert not policy.speculate_now()
        _steps(policy, 1, 0.1)  # the off epoch of measuring again is full
        assert policy.speculate_now()  # measuring the on epoch
        _steps(policy, EPOCH_STEPS, 0.11, tokens=12, proposals=8)
    _steps(policy, CHECK_STEPS, 0.1, tokens=6, proposals=8)  # this time it pays: on for good
    _steps(policy, KEEP_STEPS - CHECK_STEPS - 1, 0.1, tokens=6, proposals=8)
    assert policy.speculate_now()


def test_what_measuring_lost_is_repaid_before_the_load_is_measured_again():
    """An "on" epoch at a third of off's speed (a draft proposing for a whole batch, none of it kept) lost 8 x 0.2 s:
    the load is not measured again until that is 1% of the time, 1,600 steps of 0.1 s, far past KEEP_STEPS."""
    policy = SpeculationPolicy()
    _steps(policy, EPOCH_STEPS, 0.1)
    _steps(policy, EPOCH_STEPS, 0.3, proposals=8)  # theta 1: no proposal pays
    assert policy.choose(WORTH, LIMITS).tolist() == [0, 0]
    _steps(policy, CHECK_STEPS, 0.1, tokens=4)  # following it proposes nothing and loses nothing: it holds
    _steps(policy, 1_600 - CHECK_STEPS - 1, 0.1, tokens=4)
    assert policy.speculate_now() and policy.choose(WORTH, LIMITS).tolist() == [0, 0]
    _steps(policy, 1, 0.1, tokens=4)
    assert not policy.speculate_now()  # measuring again: off first


def test_a_lighter_load_follows_a_heavier_ones_price_unmeasured():
    """A draining batch passes through loads it leaves before a measurement ends: where speculating paid at a
    heavier load it pays here (a proposal costs no more), so that price holds."""
    policy = _priced(on_seconds=0.11, batch=16)
    _steps(policy, 1, 0.1, tokens=6, batch=5, proposals=8)
    assert policy.speculate_now() and policy.choose(WORTH, LIMITS).tolist() == [4, 4]
    policy = _priced(on_seconds=0.11, batch=2)
    _steps(policy, 1, 0.1, tokens=6, batch=16, proposals=8)
    assert not policy.speculate_now()  # a heavier load than any measured: measuring off


def test_another_load_is_measured_unless_a_lighter_one_did_not_pay():
    policy = _priced(on_seconds=0.11, batch=4)
    _steps(policy, 1, 0.1, tokens=6, batch=5, proposals=8)
    assert policy.speculate_now()  # the same load
    _steps(policy, 1, 0.1, batch=32)  # eight times the batch: what held at 4 says nothing here
    assert not policy.speculate_now()  # measuring off
    _steps(policy, EPOCH_STEPS, 0.4, tokens=32, batch=32)
    _steps(policy, EPOCH_STEPS, 0.5, tokens=32, batch=32, proposals=64)
    _steps(policy, CHECK_STEPS, 0.5, tokens=32, batch=32, proposals=64)  # 64 tokens/s, off had 80
    assert not policy.speculate_now()
    _steps(policy, 1, 0.1, batch=4)  # back at 4: its price holds, no measuring
    assert policy.speculate_now() and policy.choose(WORTH, LIMITS).tolist() == [4, 4]
    _steps(policy, 1, 0.4, batch=100)  # heavier than a load where it did not pay: off, no measuring
    assert not policy.speculate_now()
    _steps(policy, EPOCH_STEPS, 0.4, batch=100)
    assert not policy.speculate_now()


def _decoding(rid: str, motif: list[int]) -> Request:
    """A request whose last token has yet to be computed, with a repetitive text prompt lookup always matches."""
    req = Request(rid, motif * 4, max_tokens=100, arrival_time=0.0)
    req.append_token(motif[0])
    req.num_computed_tokens = req.num_tokens - 1
    return req


def test_each_request_verifies_what_its_own_acceptance_pays_for():
    spec = Speculator(SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 4}), max_model_len=1_000)
    good, bad = _decoding("good", [5, 6, 7, 8, 9]), _decoding("bad", [11, 12, 13, 14, 15])
    _steps(spec.policy, EPOCH_STEPS, 0.1, batch=2)
    for step in range(EPOCH_STEPS):
        spec.propose([good, bad])
        # measuring: every proposal verified, every other step by every other request
        assert (len(good.spec_token_ids), len(bad.spec_token_ids)) == (4, 4 if step % 2 == 0 else 0)
        # good's proposals all hold; bad's first never does
        bad_rows = 1 + len(bad.spec_token_ids)
        sampled = good.spec_token_ids + [1] + [0] * bad_rows
        out = SchedulerOutput([ScheduledRequest(good, 5), ScheduledRequest(bad, bad_rows)])
        assert spec.verify(out, [good, bad], [5, bad_rows], sampled) == [5, 1]
        spec.policy.observe_step(6, 0.2, 2, 8)
    # a proposal costs 12.5 ms at 40 tokens/s: theta 0.5, above what bad's first proposal is worth
    spec.propose([good, bad])
    assert (len(good.spec_token_ids), len(bad.spec_token_ids)) == (4, 0)


def test_a_proposal_after_a_kept_one_is_worth_its_own_measured_chance_not_the_first_ones_again():
    """Quoting: the first proposal holds 3 times in 4, and once it holds the rest do. Each proposal's worth is the
    chance it and those before it hold: 3/4 for every position, where the first's rate to the j-th power would give
    0.32 at the fourth and cut it at a price the measured chances pay."""
    spec = Speculator(SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 4}), max_model_len=1_000)
    quoting, fresh = _decoding("quoting", [5, 6, 7, 8, 9]), _decoding("fresh", [11, 12, 13, 14, 15])
    for _ in range(50):
        for kept in (4, 4, 4, 0):
            spec._record(quoting, 4, kept)
    worth = spec.worth([quoting, fresh], 4)
    np.testing.assert_allclose(worth[0], [0.75] * 4, atol=0.05)  # recent verifications weigh more
    np.testing.assert_allclose(worth[1], [0.75] * 4, atol=0.01)  # a new request starts from every request's counts
    assert proposals_worth_verifying(worth, np.array([4, 4]), 0.5).tolist() == [4, 4]


def test_a_drafts_pass_is_priced_apart_from_its_proposals_and_run_only_where_its_depth_repays_it():
    """The "on" epoch alternates 8 requests proposing 4 each and 4 doing so: the same 4 passes of a draft, half the
    proposals. 0.1 s off, 1 ms a proposal, 10 ms a pass: 0.172 s and 0.156 s. A depth whose proposals are worth less
    than a pass beyond their own price is not run, even where each proposal alone would pay."""
    policy = SpeculationPolicy()
    _steps(policy, EPOCH_STEPS, 0.1, tokens=8, batch=8)
    limits = np.full(8, 4)
    for step in range(EPOCH_STEPS):
        ks = policy.choose(_geometric([0.9] * 8), limits)
        assert ks.sum() == (32 if step % 2 == 0 else 16)
        policy.observe_step(12, 0.1 + 0.001 * ks.sum() + 0.01 * ks.max(), 8, int(ks.sum()), int(ks.max()))
    # 80 tokens/s: a proposal costs theta 0.08 tokens' worth, a pass 0.8; 8 requests at 0.9^j: every depth pays
    assert policy.choose(_geometric([0.9] * 8), limits).tolist() == [4] * 8
    # one request at 0.9^j: each proposal pays its 0.08, but no depth repays a pass (0.9 - 0.08 > 0.8 only the first)
    assert policy.choose(_geometric([0.9]), np.array([4])).tolist() == [1]


def test_a_step_that_verifies_any_proposal_is_priced_apart_and_run_only_where_its_proposals_repay_it():
    """One request, the "on" epoch alternating 4 proposals and 2: 0.1 s off (a step of a burst), 5 ms a proposal and
    20 ms a step that verifies any (what the burst shared): 0.14 s and 0.13 s. At 10 tokens/s a proposal costs 0.05
    tokens' worth and the step 0.2: a first proposal worth 0.2 pays its row, not the step."""
    policy = SpeculationPolicy()
    _steps(policy, EPOCH_STEPS, 0.1, tokens=1, batch=1)
    for step in range(EPOCH_STEPS):
        ks = policy.choose(_geometric([0.5]), np.array([4]))
        assert ks.tolist() == [4 if step % 2 == 0 else 2]
        policy.observe_step(1, 0.1 + 0.02 + 0.005 * ks.sum(), 1, int(ks.sum()))
    assert policy.choose(_geometric([0.5]), np.array([4])).tolist() == [4]  # 0.94 - 4 x 0.05 > 0.2
    assert policy.choose(_geometric([0.2]), np.array([4])).tolist() == [0]  # 0.2 - 0.05 < 0.2
    # following it: a step of 4 proposals costs 0.14 s, off's 0.1 s; what off would have made in the same steps
    # counts the step's 20 ms too, so 1.6 tokens a step (11.4 tokens/s) is not taken for losing
    _steps(policy, CHECK_STEPS, 0.14, tokens=1.6, batch=1, proposals=4)
    assert policy.speculate_now()


def test_a_step_that_verifies_is_weighed_against_the_plain_step_it_replaces_not_against_the_rate_speculating_reached():
    """One request quoting its prompt: 0.1 s off, 50 ms a step that verifies any and 5 ms a proposal. Once its steps
    make 4 tokens in 0.17 s (23.5 tokens/s), three proposals worth 0.875 tokens still pay their step (1.875 tokens in
    0.165 s, 11.4 tokens/s, where a plain step makes 10): priced at the rate reached (the step 1.18 tokens' worth) they
    did not, and the step after a refused one ran plain."""
    policy = SpeculationPolicy()
    _steps(policy, EPOCH_STEPS, 0.1, tokens=1, batch=1)
    for step in range(EPOCH_STEPS):
        ks = policy.choose(_geometric([0.5]), np.array([4]))
        policy.observe_step(1, 0.1 + 0.05 + 0.005 * ks.sum(), 1, int(ks.sum()))
    _steps(policy, EPOCH_STEPS, 0.17, tokens=4, batch=1, proposals=4)
    assert policy._epoch.rate > 2 * policy._price.off_rate and policy.speculate_now()
    assert policy.choose(_geometric([0.5]), np.array([4])).tolist() == [3]  # the fourth's 0.06 < 0.12: the rate now
    assert policy.choose(_geometric([0.3]), np.array([4])).tolist() == [0]  # 0.42 - 2 x 0.05 < 0.5: off's step wins


# A server's 32-stream chat, recorded (one engine step a call): the "on" epoch's steps, as (proposals, seconds); which
# requests find a match moves the count from step to step, so alternating shapes do not alternate the count
SERVER_ON_EPOCH = [(6, 0.1019), (6, 0.096), (12, 0.1145), (12, 0.1255), (12, 0.1186), (6, 0.1359), (6, 0.0955),
                   (6, 0.1091)]


def test_a_proposal_is_priced_on_each_steps_own_count_not_on_medians_of_shapes_that_did_not_alternate():
    """The alternating shapes' medians of this epoch (9 and 6 proposals; 0.108 s and 0.117 s) priced a proposal at
    nothing, and every proposal was then verified; each step's own count prices it at ~2.8 ms."""
    policy = SpeculationPolicy()
    _steps(policy, EPOCH_STEPS, 0.0807, tokens=32, batch=32)
    for proposals, seconds in SERVER_ON_EPOCH:
        policy.observe_step(32, seconds, 32, proposals)
    price = policy._price
    assert 0.002 < price.proposal_seconds < 0.004, price
    # at ~400 tokens/s a proposal costs over a token's worth: none is worth verifying
    assert policy.choose(_geometric([0.9] * 32), np.full(32, 4)).sum() == 0


def test_following_a_price_measured_too_cheap_stops_where_the_steps_that_verified_nothing_show_off_faster():
    """The host sped up between measuring and following (a busy host's off epoch 0.08 s a step, then 0.055 s): the
    price says nothing costs much, and steps of 34 proposals (0.128 s, recorded) make 33 tokens where plain ones make
    32 in 0.055 s. Against the rate measured with the price (400 tokens/s) following looks a gain, and against what
    the price says the same steps would have taken off it always does; the plain steps between them measure off."""
    policy = SpeculationPolicy()
    _steps(policy, EPOCH_STEPS, 0.08, tokens=32, batch=32)
    _steps(policy, EPOCH_STEPS, 0.081, tokens=33, batch=32, proposals=34)  # 30 µs a proposal
    assert policy.speculate_now()
    for step in range(4 * CHECK_STEPS):
        verifies = step % 5 == 0
        policy.observe_step(32 + verifies, 0.128 if verifies else 0.055, 32, 34 * verifies, proposing_seconds=0.0008)
        if not policy.speculate_now():
            break
    assert not policy.speculate_now() and step < 2 * CHECK_STEPS


def test_what_proposing_costs_every_step_is_not_taken_for_what_off_would_have_spent():
    """Proposing takes 5 ms of each 0.1 s step and no proposal is ever verified: the steps that verified nothing
    measure off at 0.095 s, so following runs 5% below off and stops."""
    policy = _priced(on_seconds=0.5)  # theta 2: nothing is verified
    for _ in range(CHECK_STEPS + EPOCH_STEPS):
        policy.observe_step(4, 0.1, 4, 0, proposing_seconds=0.005)
    assert not policy.speculate_now()


def test_a_pause_of_the_host_in_a_measuring_epoch_counts_as_a_few_steps_lost_not_as_its_length():
    """A 70 s pause among 0.1 s steps would count as 700 off steps lost and hold the load's price for 70,000 steps;
    a step counts at most OUTLIER_STEPS of its epoch's median."""
    policy = SpeculationPolicy()
    _steps(policy, EPOCH_STEPS, 0.1)
    _steps(policy, EPOCH_STEPS - 1, 0.11, tokens=12, proposals=8)
    policy.observe_step(12, 70.0, 4, 8)
    assert policy.counters.lost_off_steps <= OUTLIER_STEPS
    assert policy.choose(WORTH, LIMITS).tolist() == [4, 4]  # the price is the medians': a pause does not move it
    following = SpeculationPolicy()
    _priced(on_seconds=0.11, policy=following)
    _steps(following, CHECK_STEPS, 0.1, tokens=6, proposals=8)
    following.observe_step(6, 70.0, 4, 8)  # a pause while following a price that pays: not taken for losing
    assert following.speculate_now()


def test_a_request_whose_first_proposal_would_not_pay_its_price_is_not_searched(monkeypatch):
    """Looking for proposals costs every step, verified or not (a server's 32 chat streams: ~1 ms of a 55 ms step):
    where a request's first proposal is worth less than a proposal costs, it would verify none, so its text is not
    searched; the proposals are those the search of every request gives."""
    spec = Speculator(SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 4}), max_model_len=1_000)
    good, bad = _decoding("good", [5, 6, 7, 8, 9]), _decoding("bad", [11, 12, 13, 14, 15])
    for _ in range(50):
        spec._record(good, 4, 4)
        spec._record(bad, 4, 0)
    _steps(spec.policy, EPOCH_STEPS, 0.1, batch=2)
    _steps(spec.policy, EPOCH_STEPS, 0.2, tokens=6, batch=2, proposals=8)  # 12.5 ms a proposal: theta 0.5
    searched = []
    monkeypatch.setattr(speculator_module, "propose_ngram",
                        lambda ids, *args: searched.append(ids[0]) or propose_ngram(ids, *args))
    spec.propose([good, bad])
    assert searched == [5] and (len(good.spec_token_ids), len(bad.spec_token_ids)) == (4, 0)
