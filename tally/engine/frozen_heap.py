"""A serving process's objects frozen out of Python's garbage collector while it serves (`gc.freeze()`, as vLLM and
SGLang do after start-up). A full collection walks every tracked object: a loaded engine's ~230,000 took ~100-150 ms,
and the thread that triggers one holds the GIL throughout, so every stream stalled that long now and then; frozen,
the walk covers what serving creates (7 ms; docs/benchmarks.md#latency-under-load).

A frozen object is still freed when its last reference goes; only cycles among frozen objects wait for a thaw. So
the server thaws before it loads an engine anew (a restart after a failure: the old model and KV pool are collected
first) and when it stops, and the process thaws at exit (frozen, extension objects are never finalized: nanobind
reports each as leaked). `LLM()` does not freeze: a process may load and drop many engines, and each thaw walks
everything."""
from __future__ import annotations

import atexit
import gc


def freeze() -> None:
    """Everything alive now (after a collection) out of the collector's walks."""
    gc.collect()
    gc.freeze()
    atexit.unregister(gc.unfreeze)  # once, however many freezes
    atexit.register(gc.unfreeze)


def thaw() -> None:
    """What freeze() froze back in the collector's walks, and collected."""
    gc.unfreeze()
    gc.collect()
