"""Whether speculation pays on this machine under this load, decided by measuring it, and how many proposals
each request verifies.

**On or off, measured.** Speculation turns a decode step into a verify step: more rows, each speculating request's
attention run on its own instead of in the batched decode call. At one stream that is nearly free beside reading
every weight once; at 32 streams on a CPU the step is compute-bound and it can cost more than the accepted tokens
bring (measured: bench/speculative.py). A cost model fitted to steps missed the overheads that matter (the lost
decode-only fast path, per-row sampling), so the policy measures the outcome itself: tokens generated per second
with speculation off for one epoch of EPOCH_STEPS steps, then on for one, and it keeps the better for the next
EXPLOIT_EPOCHS epochs before measuring again — or sooner, as soon as the batch it serves is half or twice the one it
measured (the answer at 1 stream says nothing about 32). On must beat off by MARGIN to be kept, so a tie costs
nothing; under a steady load the measuring epochs cost at most 2 / (2 + EXPLOIT_EPOCHS) of the time at the worse
setting.

While on, every proposal is verified. (A per-request cut — stop where α^j, the j-th proposal's expected worth at
the request's acceptance α, falls below 0.25 — was tried: with it the policy got 1.06x on code completion at one
stream where verifying everything got 1.51x (bench/speculative.py) — cut to one proposal, the measured epoch
with speculation on no longer beat the one without. At one stream a verified row costs almost nothing; whether
rows cost is what the on/off measurement already answers.)"""
from __future__ import annotations

from dataclasses import dataclass

EPOCH_STEPS = 24
EXPLOIT_EPOCHS = 20
MARGIN = 1.02


@dataclass
class Epoch:
    speculate: bool
    steps: int = 0
    tokens: int = 0
    seconds: float = 0.0
    batch: int = 0  # running requests, summed over steps

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


class SpeculationPolicy:
    def __init__(self) -> None:
        self._measured: dict[bool, float] = {}  # tokens/s with speculation off (False) and on (True)
        self._measured_batch = 0.0  # the mean batch those were measured at
        self._epoch = Epoch(speculate=False)  # measure off first
        self._exploit_left = 0
        self.speculating = False  # what this epoch does (read by the engine's metrics)

    # -- measurements ------------------------------------------------------------------------
    def observe_step(self, generated_tokens: int, seconds: float, batch: int) -> None:
        """Every step without a prompt chunk (a chunk's cost has nothing to do with speculation, and one landing in
        one epoch and not the other decided the comparison): the tokens it appended to outputs, how long it took,
        and how many requests were running."""
        epoch = self._epoch
        epoch.steps += 1
        epoch.tokens += generated_tokens
        epoch.seconds += seconds
        epoch.batch += batch
        if self._exploit_left and not 0.5 <= (batch + 1) / (self._measured_batch + 1) <= 2.0:
            self._exploit_left, self._epoch = 0, Epoch(speculate=False)  # another load: measure again now
            self._measured.clear()
            self.speculating = False
            return
        if epoch.steps < EPOCH_STEPS:
            return
        if self._exploit_left:
            self._exploit_left -= 1
            self._epoch = Epoch(epoch.speculate)
            if not self._exploit_left:  # measure again: the load may have changed
                self._measured.clear()
                self._epoch = Epoch(speculate=False)
        else:
            self._measured[epoch.speculate] = epoch.rate
            self._measured_batch = epoch.batch / epoch.steps
            if len(self._measured) < 2:
                self._epoch = Epoch(speculate=not epoch.speculate)
            else:
                keep = self._measured[True] > MARGIN * self._measured[False]
                self._epoch = Epoch(speculate=keep)
                self._exploit_left = EXPLOIT_EPOCHS
        self.speculating = self._epoch.speculate

    # -- the choice --------------------------------------------------------------------------
    def speculate_now(self) -> bool:
        """False in an epoch that measures (or keeps) speculation off: nothing need be proposed."""
        return self._epoch.speculate

    def choose(self, proposals: list[int]) -> list[int]:
        """For requests that proposed tokens (how many each), how many to verify."""
        return list(proposals) if self._epoch.speculate else [0] * len(proposals)
