from __future__ import annotations

import math

from tally.engine.queue_delay import QueueDelay


def test_the_wait_is_the_requests_ahead_over_the_recent_start_rate():
    now = [0.0]
    delay = QueueDelay(window_s=30.0, clock=lambda: now[0])
    assert delay.predicted_wait_s(5) == 0.0  # nothing measured: no ground to refuse on
    for t, started in ((0.0, 0), (10.0, 10), (20.0, 20)):
        now[0] = t
        delay.observe(started)
    assert delay.predicted_wait_s(5) == 5.0  # one start a second
    now[0] = 60.0
    delay.observe(20)  # nothing started for 40 s: the old samples leave the window
    now[0] = 61.0
    delay.observe(20)
    assert math.isinf(delay.predicted_wait_s(1))
