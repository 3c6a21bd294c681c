"""How long a new request would wait for a batch slot, predicted from how fast requests have been starting:
the requests ahead of it ÷ the starts per second over the last WINDOW_S. `tally serve --max-queue-delay S` refuses
(429, Retry-After) a request whose predicted wait is longer than S, instead of letting it time out in the queue."""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

WINDOW_S = 30.0


class QueueDelay:
    def __init__(self, window_s: float = WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self._clock = clock
        self._samples: deque[tuple[float, int]] = deque()  # (time, requests started so far)

    def observe(self, num_started: int) -> None:
        now = self._clock()
        self._samples.append((now, num_started))
        while len(self._samples) > 2 and self._samples[1][0] <= now - self.window_s:
            self._samples.popleft()

    def predicted_wait_s(self, ahead: int) -> float:
        """Seconds until `ahead` requests have started at the recent rate; infinite when none started lately."""
        if len(self._samples) < 2:
            return 0.0  # nothing measured yet: no prediction to refuse on
        (t0, started0), (t1, started1) = self._samples[0], self._samples[-1]
        span_s = max(t1 - t0, 1.0)
        rate = (started1 - started0) / span_s
        return ahead / rate if rate > 0 else float("inf")
