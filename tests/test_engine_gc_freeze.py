"""A loaded engine's objects are frozen out of Python's garbage collector (tally/engine/startup/frozen_heap.py): a full
collection then walks what serving creates, not the ~230,000 objects of a loaded model, whose walk held the GIL
~140 ms and so stalled every stream each time one ran. A later load unfreezes them first, so an engine dropped while
in a reference cycle (the server's restart after a failure drops the old one) is still collected."""
from __future__ import annotations

import gc
import weakref

from tally import LLM


def test_a_loaded_engine_is_frozen_and_one_dropped_in_a_cycle_is_still_collected() -> None:
    first = LLM(None, max_model_len=256, kv_cache_memory=64 << 20)
    assert gc.get_freeze_count() > 10_000
    engine = first.engine
    engine.itself = engine  # a cycle: only the collector frees it, and only unfrozen
    gone = weakref.ref(engine)
    del first, engine
    gc.collect()
    assert gone() is not None  # frozen: the collector does not look at it
    LLM(None, max_model_len=256, kv_cache_memory=64 << 20)
    assert gone() is None
