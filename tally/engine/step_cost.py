"""How long a step takes, learned from the steps the engine runs, so a latency target holds on the machine at hand
(and under its load) rather than on a figure measured elsewhere."""
from __future__ import annotations

import math
from collections import deque

import numpy as np

HISTORY = 24
DECAY = 0.9  # a step's weight in the fit, per later step
PROBE_TOKENS = 64
JITTER_QUANTILE = 1.0
MAX_JITTER = 3.0  # a step stalled by something else entirely (a swap, a GC) does not shrink every later one


class StepCost:
    """A step that carries prompt chunks beside the decodes costs  a + f·x + b·c + e·c·x  seconds for c prompt tokens
    attending a mean context x: a fixed part (the decodes, and a mixed step's own overhead), reading the context back
    once per layer whatever the chunk's size, the projections of each token, and attention that grows with the context
    each token reads. The four are fitted by weighted least squares to the last HISTORY such steps, newer ones weighing
    more.

    The fit predicts a step's usual time; a shared or throttled CPU makes steps of identical work vary, and a stream
    feels the slow ones. So a step is planned to fit the target when it runs as slow as a slow recent step ran against
    the fit (the JITTER_QUANTILE of actual / fitted): on a quiet machine that ratio is near 1 and costs nothing.

    Until a fit exists, the engine sends probe chunks of alternating sizes (PROBE_TOKENS and half of it), so that
    the fit sees at least two sizes and can tell the fixed part from the per-token part."""
    def __init__(self) -> None:
        self._steps: deque[tuple[float, float, float]] = deque(maxlen=HISTORY)  # (tokens, mean context, s)
        self._fit: tuple[float, float, float, float] | None = None
        self._jitter = 1.0  # kept with the fit: planning reads it every step, steps change it only when observed

    def observe(self, prompt_tokens: int, mean_context: float, seconds: float) -> None:
        """A step that carried `prompt_tokens` prompt tokens attending `mean_context` on average."""
        if prompt_tokens == 0:
            return
        self._steps.append((prompt_tokens, mean_context, seconds))
        self._fit = self._refit() or self._fit  # a step too noisy to separate the parts keeps the last fit
        self._jitter = self._measure_jitter()

    def prompt_tokens_within(self, seconds: float, context: int) -> int:
        """Prompt tokens, starting at `context`, a step beside the decodes may carry to take at most `seconds`
        even when it runs as slowly as recent steps did against their prediction."""
        if self._fit is None:
            return PROBE_TOKENS >> (len(self._steps) % 2)
        a, f, b, e = self._fit
        left = seconds / self._jitter - a - f * context
        if left <= 0:
            return 0
        start = b + e * context  # c tokens from `context` cost c·start + e·c²/2 beyond a
        if e == 0.0:
            return int(left / start)
        return int((math.sqrt(start * start + 2 * e * left) - start) / e)

    def predict_seconds(self, prompt_tokens: int, mean_context: float) -> float | None:
        """What the fit says a step carrying `prompt_tokens` prompt tokens attending `mean_context` takes; None
        before a fit."""
        if self._fit is None:
            return None
        a, f, b, e = self._fit
        return a + f * mean_context + b * prompt_tokens + e * prompt_tokens * mean_context

    def prefill_seconds(self, tokens: int) -> float | None:
        """What computing `tokens` prompt tokens from the start costs (the swap space prices a recompute with it): by
        the fit, as one step (chunked over several, each adds its fixed part); before a fit, at the mean seconds per
        prompt token of the steps seen; None before any."""
        if self._fit is not None:
            a, f, b, e = self._fit
            return a + f * tokens / 2 + b * tokens + e * tokens * tokens / 2
        if not self._steps:
            return None
        return sum(s for _, _, s in self._steps) / sum(c for c, _, _ in self._steps) * tokens

    def jitter(self) -> float:
        """How much slower than the fit a slow recent step ran (>= 1)."""
        return self._jitter

    def _measure_jitter(self) -> float:
        if self._fit is None:
            return 1.0
        a, f, b, e = self._fit
        c, x, s = (np.array(v, dtype=np.float64) for v in zip(*self._steps))
        ratios = s / np.maximum(a + f * x + b * c + e * c * x, 1e-6)
        return float(min(MAX_JITTER, max(1.0, np.quantile(ratios, JITTER_QUANTILE))))

    def _refit(self) -> tuple[float, float, float, float] | None:
        if len(self._steps) < 4 or len({c for c, _, _ in self._steps}) < 2:
            return None
        c, x, s = (np.array(v, dtype=np.float64) for v in zip(*self._steps))
        w = np.sqrt(DECAY ** np.arange(len(c))[::-1])
        features = np.stack([np.ones_like(c), x, c, c * x], axis=1)
        scale = np.maximum(features.max(axis=0), 1e-9)  # columns of similar size, for a well-conditioned solve
        theta = nonnegative_lstsq(features / scale * w[:, None], s * w) / scale
        if theta[2] <= 0:  # the steps do not separate the fixed part from the per-token part yet
            return None
        a, f, b, e = (float(t) for t in theta)
        return a, f, b, e


def nonnegative_lstsq(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0: a cost is never negative, and clamping a negative one after an
    unconstrained solve would leave the others fitted to it. Drops the most negative term and refits until none is
    (k terms: at most k solves)."""
    active = np.ones(a.shape[1], dtype=bool)
    theta = np.zeros(a.shape[1])
    while active.any():
        theta[:] = 0.0
        theta[active], *_ = np.linalg.lstsq(a[:, active], y, rcond=None)
        if (theta >= 0).all():
            break
        active[np.argmin(theta)] = False
    return np.maximum(theta, 0.0)
