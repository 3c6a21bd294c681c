"""Hand the pages the C heap holds free back to the OS, now and then (glibc only).

glibc keeps freed chunks in each thread's malloc arena and returns only what sits at the top of a heap. A server
frees a lot after start-up (loading, the path measurement) and its engine thread allocates buffers of a new size
at nearly every step, so its RSS overstates what is live: on the built-in model the first trims gave back ~270 MB
of ~1 GB (docs/benchmarks.md#reliability). `malloc_trim(0)` returns the whole free pages inside every arena. It
walks the arenas' free lists, so the engine thread calls it between steps (its own arena is then idle), at most
once an interval. Where malloc_trim does not exist (musl, macOS) this does nothing.
"""
from __future__ import annotations

import time

from tally.platform import libc_function

TRIM_INTERVAL_S = 10.0  # one trim costs ~ms (docs/benchmarks.md#reliability): under 0.1% of the engine's time


class HeapTrimmer:
    def __init__(self, interval_s: float = TRIM_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._trim = libc_function("malloc_trim")
        self._last = time.monotonic()
        self.num_trims = 0
        self.trim_seconds = 0.0  # time spent trimming, for the ledger of where the engine thread's time goes

    @property
    def available(self) -> bool:
        return self._trim is not None

    def maybe_trim(self) -> None:
        """Trim if an interval has passed since the last trim."""
        start = time.monotonic()
        if self._trim is None or start - self._last < self.interval_s:
            return
        self._trim(0)
        self._last = time.monotonic()
        self.num_trims += 1
        self.trim_seconds += self._last - start
