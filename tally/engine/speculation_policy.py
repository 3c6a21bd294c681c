"""How many proposed tokens each request verifies this step (0 = speculation off for it), chosen to maximise
expected tokens per second from what this machine and these requests have shown.

Two measurements drive it:
- **Acceptance.** For each request, the share of verified positions whose proposal was accepted, α (its own
  counts, pulled toward the engine's recent average while it has few). Proposals accepted one after another
  with probability α each: the j-th proposed token adds α^j expected tokens.
- **Step cost.** A decode step (no prompt chunk) costs  a + b·T + d·R  seconds for T tokens in the step, R of
  the requests verifying proposals (each such request's attention runs on its own, not in the batched decode
  call): fitted by non-negative least squares over the last HISTORY decode steps.

Starting from no proposals (every decoding request yields one token), proposals are added in order of their
gain α^j while the expected tokens per second rise. Every EXPLORE_EVERY-th step verifies every proposal, so the
cost of proposals stays measured even while the policy has switched them off."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from tally.engine.step_cost import nonnegative_lstsq

HISTORY = 64
EXPLORE_EVERY = 16
PRIOR_ACCEPTANCE = 0.5  # the engine's acceptance before any proposal was verified
PRIOR_WEIGHT = 4  # a request's own counts outweigh the engine's average after this many verified positions
AVERAGE_DECAY = 0.98  # the engine's average acceptance, per verified position


@dataclass
class Acceptance:
    accepted: int = 0
    verified: int = 0


class SpeculationPolicy:
    def __init__(self) -> None:
        self._steps: deque[tuple[int, int, float]] = deque(maxlen=HISTORY)  # (tokens, rows verifying, seconds)
        self._fit: tuple[float, float, float] | None = None
        self._average = PRIOR_ACCEPTANCE
        self._num_choices = 0

    # -- measurements ------------------------------------------------------------------------
    def observe_step(self, tokens: int, verifying_rows: int, seconds: float) -> None:
        """A step of decodes only: `tokens` in all, `verifying_rows` of its requests verifying proposals."""
        self._steps.append((tokens, verifying_rows, seconds))
        self._fit = self._refit()

    def observe_verified(self, acceptance: Acceptance, proposed: int, accepted: int) -> None:
        """A request verified `proposed` tokens and the first `accepted` of them held."""
        verified = min(proposed, accepted + 1)  # positions after the first rejection were never judged
        acceptance.accepted += accepted
        acceptance.verified += verified
        for i in range(verified):
            self._average = AVERAGE_DECAY * self._average + (1 - AVERAGE_DECAY) * (i < accepted)

    def acceptance_rate(self, acceptance: Acceptance) -> float:
        return ((acceptance.accepted + PRIOR_WEIGHT * self._average)
                / (acceptance.verified + PRIOR_WEIGHT))

    # -- the choice --------------------------------------------------------------------------
    def choose(self, num_decoding: int, proposals: list[tuple[int, float]]) -> list[int]:
        """For `num_decoding` requests decoding this step, of which some proposed tokens — (how many, their
        acceptance rate) each — how many of each request's proposals to verify."""
        self._num_choices += 1
        if self._fit is None or self._num_choices % EXPLORE_EVERY == 0:
            return [n for n, _ in proposals]
        a, b, d = self._fit
        gains = sorted(((rate ** j, i) for i, (n, rate) in enumerate(proposals) for j in range(1, n + 1)),
                       reverse=True)
        chosen = [0] * len(proposals)
        tokens = expected = float(num_decoding)
        rows = 0
        seconds = a + b * tokens
        for gain, i in gains:
            # A request's j-th proposal is only worth anything with the j-1 before it: take them in order.
            new_row = chosen[i] == 0
            t = a + b * (tokens + 1) + d * (rows + new_row)
            if (expected + gain) * seconds <= expected * t:
                continue
            chosen[i] += 1
            tokens, rows, expected, seconds = tokens + 1, rows + new_row, expected + gain, t
        return chosen

    def _refit(self) -> tuple[float, float, float] | None:
        if len(self._steps) < 8 or len({(t, r) for t, r, _ in self._steps}) < 3:
            return None
        t, r, s = (np.array(v, dtype=np.float64) for v in zip(*self._steps))
        features = np.stack([np.ones_like(t), t, r], axis=1)
        scale = np.maximum(features.max(axis=0), 1e-9)
        a, b, d = nonnegative_lstsq(features / scale, s) / scale
        return float(a), float(b), float(d)
