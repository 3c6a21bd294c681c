"""How long a step takes, learned from the steps the engine runs, so a latency target holds on the machine at hand
(and under its load) rather than on a figure measured elsewhere.

A step that carries prompt chunks beside the decodes costs  a + f·x + b·c + e·c·x  seconds for c prompt tokens
attending a mean context x: a fixed part (the decodes, and a mixed step's own overhead — on the development CPU a
mixed step cost twice a decode-only one before its first prompt token), reading the context back once per layer
whatever the chunk's size, the projections of each token, and attention that grows with the context each token
reads (a token of a 3,500-token prompt cost 0.8 ms at its start, 3.5 ms at its end). The four are fitted by
weighted least squares to the last HISTORY such steps, newer ones weighing more. Until enough steps of
different sizes have been seen, the engine sends a chunk of PROBE_TOKENS."""
from __future__ import annotations

import math
from collections import deque

import numpy as np

HISTORY = 24
DECAY = 0.9  # a step's weight in the fit, per later step
PROBE_TOKENS = 64


class StepCost:
    def __init__(self) -> None:
        self._steps: deque[tuple[float, float, float]] = deque(maxlen=HISTORY)  # (tokens, mean context, s)
        self._fit: tuple[float, float, float, float] | None = None

    def observe(self, prompt_tokens: int, mean_context: float, seconds: float) -> None:
        """A step that carried `prompt_tokens` prompt tokens attending `mean_context` on average."""
        if prompt_tokens == 0:
            return
        self._steps.append((prompt_tokens, mean_context, seconds))
        self._fit = self._refit() or self._fit  # a step too noisy to separate the parts keeps the last fit

    def prompt_tokens_within(self, seconds: float, context: int) -> int:
        """Prompt tokens, starting at `context`, a step beside the decodes may carry to take at most `seconds`."""
        if self._fit is None:
            return PROBE_TOKENS
        a, f, b, e = self._fit
        left = seconds - a - f * context
        if left <= 0:
            return 0
        start = b + e * context  # c tokens from `context` cost c·start + e·c²/2 beyond a
        if e == 0.0:
            return int(left / start)
        return int((math.sqrt(start * start + 2 * e * left) - start) / e)

    def _refit(self) -> tuple[float, float, float, float] | None:
        if len(self._steps) < 4 or len({c for c, _, _ in self._steps}) < 2:
            return None
        c, x, s = (np.array(v, dtype=np.float64) for v in zip(*self._steps))
        w = np.sqrt(DECAY ** np.arange(len(c))[::-1])
        features = np.stack([np.ones_like(c), x, c, c * x], axis=1)
        scale = np.maximum(features.max(axis=0), 1e-9)  # columns of similar size, for a well-conditioned solve
        theta, *_ = np.linalg.lstsq(features / scale * w[:, None], s * w, rcond=None)
        a, f, b, e = theta / scale
        if b <= 0:  # the steps do not separate the fixed part from the per-token part yet
            return None
        return max(a, 0.0), max(f, 0.0), b, max(e, 0.0)
