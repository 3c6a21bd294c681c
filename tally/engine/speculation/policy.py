"""How many proposals each request verifies (0: none), from its measured acceptance and the price of a proposal
measured on this machine at this load; and whether speculating at that price pays at all.

- The price: an epoch with speculation off, then one whose steps alternate between every request verifying every
  proposal and every other request doing so; from the step times (step times, not tokens: acceptance swings with
  the text) t = t_off + s + c · proposals + d · passes, c the median slope over each step's own proposal count:
  c seconds a proposal (its verify row), d a pass (a draft's forward pass, run once per proposal depth whatever the
  rows) and s a step that verifies any (what the step does beyond a plain decode: its verify bookkeeping, and with
  LLM() the burst of decode steps it cannot run), less what a draft spent catching up on the requests it started
  on (each request's own start price) and what finding and choosing proposals took (paid by every step while
  speculating, verified or not: the check weighs it).
- Per request: its j-th proposal is worth w_j = f · g^(j-1) tokens (f: its first proposal's acceptance, g: a later
  one's after a kept predecessor) and pays while w_j ≥ c · rate (rate: tokens a second now on the price's clock,
  the steps' tokens over what the price says they cost, so that a shared host's speed, which moves between minutes,
  cancels); a depth j is run while its proposals' worth beyond their price repays d · rate; a step verifies anything
  only where its proposals' worth beyond c, d and s repays them at off's rate when priced (the plain step it
  replaces, on the same clock); with a draft model a request starts
  only where its expected gain repays the draft's catch-up over its context.
- Checked: if following the price falls MARGIN below off's tokens per second, speculation is off at that load for
  RETRY_STEPS steps (doubling per failure); a price holds KEEP_STEPS steps, then is measured again. Off's rate is
  that of the steps since the price that verified nothing, where there are EPOCH_STEPS of them (measured in the
  same mix, where a price measured too cheap would excuse its own loss). A load is measured unless a lighter load
  already did not pay (off) or a heavier one paid (followed). A step counts at most OUTLIER_STEPS medians.
- Amortised: whatever measuring a price lost against off (the "on" epoch, a draft's catch-up in it, and the steps
  that followed a price until it failed) is repaid by holding that price for at least the steps that make the loss
  MEASURE_SHARE of their time, so measuring costs at most that share of a server's time however badly it lost.
Why each rule exists, with the runs that showed it: docs/benchmarks.md#speculative-decoding."""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

import numpy as np

from tally.engine.speculation.config import MAX_SPECULATIVE_TOKENS

EPOCH_STEPS = 8  # steps of a measuring epoch (steps carrying a prompt chunk are not counted)
CHECK_STEPS = 24  # steps of following a price before its outcome is compared with off's
KEEP_STEPS = 500  # counted steps a price holds before its load is measured again
RETRY_STEPS = 48  # counted steps a price that did not pay holds, doubling with each failure in a row at its load
MARGIN = 1.02  # following the price must not fall this many times below off's tokens per second
# A batch this many times larger or smaller than a price's is another load, on the batch itself: one stream is a load
# apart from two (a verify row that costs most of a decode step pays for one and not for two), and steps checked
# against the plain ones beside them are of one load.
LOAD_RATIO = 2.0
MEASURE_SHARE = 0.01  # the most of a load's time its measuring may have lost against off, once its price expires
# A step counts at most this many times its epoch's median step: twice the dearest step speculation makes (a draft as
# dear as the target, a pass per proposal depth beside the target's own), so one past it is the host's own pause,
# which would otherwise count as measuring's loss and hold speculation off for a hundred times its length.
OUTLIER_STEPS = 2 * (MAX_SPECULATIVE_TOKENS + 1)


@dataclass
class Epoch:
    speculate: bool
    seconds: list[float] = field(default_factory=list)  # per step, less catch-up and proposing (the median prices)
    tokens: float = 0.0
    batch: int = 0  # requests the steps ran, summed
    proposals: int = 0  # proposals verified, summed over steps
    passes: int = 0  # proposal depths (the most any request verified), summed over steps
    shapes: list[tuple[int, int]] = field(default_factory=list)  # per step: (proposals, passes)
    speculated: int = 0  # steps that verified proposals
    catch_up: float = 0.0  # seconds a draft spent catching up, left out of `seconds` and `elapsed`
    proposing: float = 0.0  # seconds spent finding proposals and choosing them, left out of the same
    predicted: float = 0.0  # what the followed price says the steps cost (its own clock: the host's speed then)
    control_seconds: float = 0.0  # the steps that verified nothing (capped, less proposing): off's steps in this mix
    control_batch: int = 0  # their requests, summed
    controls: int = 0  # their count
    _tail_elapsed: float = 0.0  # the steps after the first EPOCH_STEPS, each capped when added

    @property
    def steps(self) -> int:
        return len(self.seconds)

    @property
    def cap_seconds(self) -> float:
        """The longest a step counts (OUTLIER_STEPS): from the median of the epoch's first steps, fixed once they
        are EPOCH_STEPS."""
        head = self.seconds[:EPOCH_STEPS]
        return OUTLIER_STEPS * statistics.median(head) if head else math.inf

    @property
    def elapsed(self) -> float:
        """The steps' seconds, less catch-up and proposing, each capped at cap_seconds."""
        cap = self.cap_seconds
        return sum(min(s, cap) for s in self.seconds[:EPOCH_STEPS]) + self._tail_elapsed

    @property
    def rate(self) -> float:
        spent = self.elapsed + self.catch_up + self.proposing
        return self.tokens / spent if spent > 0 else 0.0

    @property
    def control_rate(self) -> float | None:
        """Tokens a second off would have made in this mix, from the steps that verified nothing (less what proposing
        cost them), once there are EPOCH_STEPS of them: measured beside the steps that verified, never priced."""
        if self.controls < EPOCH_STEPS or self.control_seconds <= 0:
            return None
        return self.control_batch / self.control_seconds

    def add(self, tokens: float, seconds: float, batch: int, proposals: int, passes: int = 0,
            catch_up: float = 0.0, proposing: float = 0.0, predicted: float = 0.0) -> None:
        priced = max(seconds - catch_up - proposing, 0.0)
        self.predicted += predicted
        self.seconds.append(priced)
        counted = min(priced, self.cap_seconds)
        if self.steps > EPOCH_STEPS:
            self._tail_elapsed += counted
        self.shapes.append((proposals, passes))
        self.passes += passes
        self.tokens += tokens
        self.batch += batch
        self.proposals += proposals
        self.speculated += proposals > 0
        self.catch_up += catch_up
        self.proposing += proposing
        if proposals == 0:
            self.control_seconds += counted
            self.control_batch += batch
            self.controls += 1

    def loss_seconds(self, off_rate: float) -> float:
        """What these steps took, catch-up and proposing included, beyond what off would have taken for their
        tokens."""
        spent = self.elapsed + self.catch_up + self.proposing
        return max(0.0, spent - self.tokens / off_rate) if off_rate > 0 else 0.0


@dataclass
class Price:
    """What a proposal cost at one load."""

    batch: float  # the mean batch it was measured at
    step: int  # when it was measured, or when it stopped paying: what it holds from
    proposal_seconds: float  # c
    pass_seconds: float  # d
    step_seconds: float  # s
    off_rate: float  # tokens/s with speculation off
    off_step_seconds: float = 0.0  # a step with speculation off, at this load
    loss_seconds: float = 0.0  # what measuring it lost against off (Epoch.loss_seconds), and following it if it failed
    pays: bool = True  # False once following it fell below off
    failures: int = 0  # measurements in a row at this load that did not pay, this one's included

    @property
    def holds_steps(self) -> int:
        base = KEEP_STEPS if self.pays else min(KEEP_STEPS, RETRY_STEPS << max(self.failures - 1, 0))
        if self.off_step_seconds <= 0:
            return base
        return max(base, math.ceil(self.loss_seconds / (MEASURE_SHARE * self.off_step_seconds)))

    def step_cost(self, proposals: int, passes: int) -> float:
        """What a step costs at this price, on the host's clock when it was measured."""
        return (self.off_step_seconds + self.step_seconds * (proposals > 0) + self.proposal_seconds * proposals
                + self.pass_seconds * passes)

    def off_rate_at(self, batch: float) -> float:
        """Off's tokens a second at `batch` requests a step, on this price's clock: within a load a decode step costs
        about what one at the price's batch did (a step's weights are read once for every request) and makes a token a
        request (two streams' rate, applied to one, would price a proposal at twice its worth in one stream's time)."""
        return self.off_rate * batch / self.batch

    def off_steps(self, seconds: float) -> float:
        """Seconds as steps with speculation off at this load."""
        return seconds / self.off_step_seconds if self.off_step_seconds > 0 else 0.0

    def fail(self, step: int, loss_seconds: float) -> None:
        self.pays, self.step = False, step
        self.failures += 1
        self.loss_seconds += loss_seconds


def same_load(batch: float, measured: float) -> bool:
    return 1 / LOAD_RATIO < batch / measured < LOAD_RATIO


def off_rate_of(epoch: Epoch, price: Price) -> float:
    """Tokens a second the epoch's steps would have made with speculation off: a token per running request a step,
    in their time less what the proposals, passes and speculating steps they ran cost at the price."""
    seconds = (epoch.elapsed - price.proposal_seconds * epoch.proposals - price.pass_seconds * epoch.passes
               - price.step_seconds * epoch.speculated)
    return epoch.batch / seconds if seconds > 0 else math.inf


def off_rate_beside(epoch: Epoch, price: Price) -> float:
    """What following the price is checked against: off's tokens a second in the same steps' mix. Where EPOCH_STEPS
    of them verified nothing, those steps measure it (a price measured too cheap excuses its own loss in
    off_rate_of, and a server mixes such steps with those that verify); else the lower of off's rate when the price
    was measured (at the epoch's batch) and off_rate_of (a stream's steps slow as its context grows)."""
    control = epoch.control_rate
    return control if control is not None else min(price.off_rate_at(epoch.batch / epoch.steps),
                                                   off_rate_of(epoch, price))


def fit_price(off: Epoch, on: Epoch) -> tuple[float, float, float]:
    """(c, d, s) from the median off step and the on epoch's steps, whose proposals vary (every request proposing,
    then every other one; one request: all its proposals, then half, and of a draft's passes): a proposal's price is
    the median slope of step time over proposals between two steps that verified different numbers of them (with one
    request: a proposal and its pass), robust to a slow step or two, and priced on each step's own count, not on a
    shape's; what the steps add beyond their proposals is the passes' where every step ran the same (a draft's
    depth), else the step's. Where every step verified as many, every added second is the proposals'."""
    t_off = statistics.median(off.seconds)
    proposals = [p for p, _ in on.shapes]
    slopes = [(t1 - t0) / (p1 - p0) for i, (p0, t0) in enumerate(zip(proposals, on.seconds))
              for p1, t1 in zip(proposals[i + 1:], on.seconds[i + 1:]) if p1 != p0]
    if not slopes:
        p = proposals[0] if proposals else 0
        return max(0.0, statistics.median(on.seconds) - t_off) / p if p else 0.0, 0.0, 0.0
    c = max(0.0, statistics.median(slopes))
    rest = max(0.0, statistics.median(t - c * p for p, t in zip(proposals, on.seconds)) - t_off)
    passes = {n for _, n in on.shapes}
    if len(passes) == 1 and (n := passes.pop()):
        return c, rest / n, 0.0
    return c, 0.0, rest


def depths_worth_passing(worth: np.ndarray, ks: np.ndarray, theta: float, pass_tokens: float) -> np.ndarray:
    """The requests' proposals cut to the deepest depth whose proposals' worth beyond their price (theta each) repays
    a pass (pass_tokens' worth of time); every deeper one repays less."""
    for depth in range(int(ks.max(initial=0)), 0, -1):
        running = ks >= depth
        if (worth[running, depth - 1] - theta).sum() >= pass_tokens:
            break
        ks = np.minimum(ks, depth - 1)
    return ks


def proposals_worth_verifying(worth: np.ndarray, limits: np.ndarray, theta: float) -> np.ndarray:
    """Per request (worth [request, j]: its (j + 1)-th proposal's expected tokens, falling with j) the largest k ≤ its
    limit whose k-th proposal is worth ≥ theta (0 when the first is not)."""
    if theta <= 0:
        return limits
    return np.minimum((worth >= theta).sum(axis=1), limits).astype(np.int64)


def measuring_half(limits: np.ndarray) -> np.ndarray:
    """Every other step of measuring: every other request with proposals verifies them (one: half of them)."""
    some = limits > 0
    if some.sum() <= 1:
        return (limits + 1) // 2
    return np.where(some & ((np.cumsum(some) - 1) % 2 == 0), limits, 0)


def step_repaid(worth: np.ndarray, ks: np.ndarray, theta: float, pass_tokens: float, step_tokens: float) -> bool:
    """Whether the step's proposals (ks per request) are worth more beyond their price and their passes' than a
    step that verifies any costs (step_tokens' worth of time): else it runs as a plain decode."""
    kept = np.where(np.arange(worth.shape[1]) < ks[:, None], worth - theta, 0.0).sum()
    return kept - pass_tokens * ks.max(initial=0) >= step_tokens


def start_repaid(worth: np.ndarray, ks: np.ndarray, theta: float, start_tokens: np.ndarray,
                 remaining: np.ndarray) -> np.ndarray:
    """Per request: whether k proposals a step, each costing theta tokens' worth of time, repay a start that costs
    start_tokens' worth over the remaining tokens (a request that costs nothing to start always is)."""
    expected = np.where(np.arange(worth.shape[1]) < ks[:, None], worth, 0.0).sum(axis=1)  # E: tokens a step
    return (start_tokens <= 0) | (remaining / (1 + expected) * (expected - ks * theta) > start_tokens)


@dataclass
class Counters:
    """What the policy did over its life, for mechanism figures (benchmarks/speculative.py): what measuring cost is
    lost_off_steps per 100 steps, at most 100 · MEASURE_SHARE once the loads' prices have held their time."""

    steps: int = 0  # counted steps
    measuring: int = 0  # steps of an "on" measuring epoch
    speculated: int = 0  # steps that verified proposals
    lost_off_steps: float = 0.0  # what measuring (and following prices that failed) lost against off, in off steps


class SpeculationPolicy:
    def __init__(self) -> None:
        self.counters = Counters()
        self._prices: list[Price] = []  # one per load measured
        self._price: Price | None = None  # the one followed now; None while measuring
        self._load = 0.0  # the batch the price is followed at (a load unlike it is looked at again)
        self._off: Epoch | None = None  # while measuring: the finished off epoch
        self._epoch = Epoch(speculate=False)  # while measuring, the epoch; else everything since the price
        self.speculating = False  # whether proposals may be verified now (read by the engine's metrics)

    # -- measurements ------------------------------------------------------------------------
    def observe_step(self, generated_tokens: float, seconds: float, batch: int, proposals: int, passes: int = 0,
                     catch_up_seconds: float = 0.0, proposing_seconds: float = 0.0) -> None:
        """Every step without a prompt chunk (a chunk's cost has nothing to do with speculation): the tokens it
        appended to outputs, how long it took, how many requests it ran, how many proposals it verified (and
        to what depth: a draft's passes; 0 with prompt lookup, where nothing runs per depth), of its seconds those a
        draft spent catching up on requests it starts on, and those spent finding and choosing proposals (paid by
        every step while speculating, whether or not it verifies any). A proposal is priced without either
        (start_repaid charges each request its own catch-up); tokens per second, and what measuring lost, count them."""
        counted = self.counters
        counted.steps += 1
        counted.speculated += proposals > 0
        epoch, price, off = self._epoch, self._price, self._off
        if price is None and off is not None:  # measuring "on"
            if not same_load(batch, off.batch / off.steps):
                self._follow(batch)  # the load moved under the measurement
                return
            if proposals == 0:
                return  # an off step: it says nothing of what a proposal costs
            counted.measuring += 1
        epoch.add(generated_tokens, seconds, batch, proposals, passes, catch_up_seconds, proposing_seconds,
                  price.step_cost(proposals, passes) if price is not None else 0.0)
        if price is not None:
            if counted.steps - price.step >= price.holds_steps or not same_load(batch, self._load):
                self._follow(batch)
            elif price.pays and epoch.steps >= CHECK_STEPS and epoch.rate * MARGIN < (
                    off_rate := off_rate_beside(epoch, price)):
                lost = epoch.loss_seconds(off_rate)
                price.fail(counted.steps, lost)
                counted.lost_off_steps += price.off_steps(lost)
                self._apply(price, self._load)
        elif epoch.steps >= EPOCH_STEPS:
            if off is None:
                self._off, self._epoch, self.speculating = epoch, Epoch(speculate=True), True
            else:
                self._measured(off, epoch)

    def _measured(self, off: Epoch, on: Epoch) -> None:
        price = Price((off.batch + on.batch) / (off.steps + on.steps), self.counters.steps, *fit_price(off, on),
                      off.rate, off.elapsed / off.steps, on.loss_seconds(off.rate))
        self.counters.lost_off_steps += price.off_steps(price.loss_seconds)
        replaced = [p for p in self._prices if same_load(p.batch, price.batch)]
        price.failures = max((p.failures for p in replaced if not p.pays), default=0)  # after one that paid: 0
        self._prices = [p for p in self._prices if not same_load(p.batch, price.batch)] + [price]
        self._apply(price, price.batch)

    def _follow(self, batch: float) -> None:
        """A new load, or the price for this one expired: follow the price measured for it, or measure."""
        # An expired price stays listed (the latest of each load) until its load is measured again: its failures
        # count on, and what did not pay at a lighter load (the last time it was measured) does not pay here.
        live = [p for p in self._prices if self.counters.steps - p.step < p.holds_steps]
        near = [p for p in live if same_load(batch, p.batch)]
        price = min(near, key=lambda p: abs(math.log(batch / p.batch)), default=None)
        if price is None and not any(same_load(batch, p.batch) for p in self._prices):
            price = next((p for p in self._prices if not p.pays and p.batch <= batch), None) or min(
                (p for p in live if p.pays and p.batch >= batch), key=lambda p: p.batch, default=None)
        if price is None:
            self._price, self._off, self._epoch, self.speculating = None, None, Epoch(speculate=False), False
        else:
            self._apply(price, batch)

    def _apply(self, price: Price, load: float) -> None:
        self._price, self._off, self._load = price, None, load
        self._epoch = Epoch(speculate=price.pays)
        self.speculating = price.pays

    # -- the choice --------------------------------------------------------------------------
    def speculate_now(self) -> bool:
        """False while speculation is measured (or known) not to pay: nothing need be proposed."""
        return self._epoch.speculate

    def _rate(self, price: Price) -> float:
        """Tokens a second now: what a second of a proposal's time is worth. On the price's own clock, the steps'
        tokens over what the price says they cost: a shared host's speed moves between minutes, and a proposal priced
        while it ran 3x slower, set against the tokens a second it makes later, would look 3x dearer (and 3x cheaper
        the other way round) for the whole hold (docs/benchmarks.md#speculative-decoding)."""
        epoch = self._epoch
        if epoch.steps < EPOCH_STEPS or epoch.predicted <= 0 or epoch.elapsed <= 0:
            return price.off_rate_at(self._batch())
        beside = (epoch.catch_up + epoch.proposing) / epoch.elapsed  # timed on the clock: as a share of the steps
        return epoch.tokens / (epoch.predicted * (1 + beside))

    def _clock_rate(self, price: Price) -> float:
        """Tokens a second now on the clock: what a second timed now is worth (a draft's catch-up, timed per token)."""
        return self._epoch.rate if self._epoch.steps >= EPOCH_STEPS else price.off_rate_at(self._batch())

    def _batch(self) -> float:
        """The requests a step runs now: the mean since the price was followed, at first the batch it was for."""
        epoch = self._epoch
        return epoch.batch / epoch.steps if epoch.steps else self._load

    def proposal_tokens(self) -> float:
        """What a proposal costs now in tokens' worth (0 while measuring, where every one is verified): a request
        whose first proposal is worth less verifies none, so need not look for any."""
        price = self._price
        return price.proposal_seconds * self._rate(price) if price is not None and self._epoch.speculate else 0.0

    def choose(self, worth: np.ndarray, limits: np.ndarray, start_seconds: np.ndarray | None = None,
               remaining: np.ndarray | None = None) -> np.ndarray:
        """Per request (each proposal's expected tokens [request, j], the most proposals it may have, and with a
        draft model what starting on it costs and the tokens it may still generate): how many to verify."""
        if not self._epoch.speculate:
            return np.zeros_like(limits)
        price = self._price
        if price is None:  # measuring the price: the fixed-K setting, for requests whose start the last price repays
            ks = limits if self._epoch.steps % 2 == 0 else measuring_half(limits)
            last = self._prices[-1] if self._prices else None
            if last is None or start_seconds is None or remaining is None or self._off is None:
                return ks
            rate = self._off.rate
            return np.where(start_repaid(worth, ks, last.proposal_seconds * rate, start_seconds * rate,
                                         remaining), ks, 0)
        rate = self._rate(price)
        theta = price.proposal_seconds * rate
        pass_tokens = price.pass_seconds * rate
        ks = depths_worth_passing(worth, proposals_worth_verifying(worth, limits, theta), theta, pass_tokens)
        if start_seconds is not None and remaining is not None:
            ks = np.where(start_repaid(worth, ks, theta, start_seconds * self._clock_rate(price), remaining), ks, 0)
        # whether to verify at all weighs the step against the plain step it replaces, at a plain step's rate: at the
        # rate speculating reached, the better proposals paid the higher the bar, and every other step ran plain
        off = price.off_rate_at(self._batch())  # off's as priced, at the batch now: on the price's clock, as _rate
        repaid = step_repaid(worth, ks, price.proposal_seconds * off, price.pass_seconds * off,
                             price.step_seconds * off)
        return ks if repaid else np.zeros_like(ks)
