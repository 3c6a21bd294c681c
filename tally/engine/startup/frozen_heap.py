"""A loaded engine's objects frozen out of Python's garbage collector (`gc.freeze()`, as vLLM and SGLang do after
start-up). A full collection walks every tracked object: a loaded engine's ~230,000 took ~140 ms, and the thread
that triggers one holds the GIL throughout, so every stream stalled that long now and then; frozen, the walk covers
what serving creates (7 ms; docs/benchmarks.md#latency-under-load). A frozen object is still freed when its last
reference goes; only cycles among frozen objects wait for an unfreeze, so a load first unfreezes and collects (an
engine restarted after a failure drops the old model and KV pool before allocating the new ones), and so does the
process's exit: frozen, extension objects would never be finalized there (nanobind reports each one as leaked)."""
from __future__ import annotations

import atexit
import gc
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def load_frozen(load: Callable[[], T]) -> T:
    """load(), with what an earlier load froze collectable again before it and everything alive frozen after it."""
    gc.unfreeze()
    gc.collect()
    loaded = load()
    gc.collect()
    gc.freeze()
    atexit.unregister(gc.unfreeze)  # once, however many loads
    atexit.register(gc.unfreeze)
    return loaded
