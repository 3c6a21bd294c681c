"""A serving engine's objects are frozen out of Python's garbage collector (tally/engine/frozen_heap.py): a full
collection then walks what serving creates, not the ~230,000 objects of a loaded model, whose walk held the GIL
~100-150 ms and so stalled every stream each time one ran. The server thaws them when it stops and before it loads
an engine anew, so one dropped while in a reference cycle (the restart after a failure drops the old engine) is
still collected."""
from __future__ import annotations

import asyncio
import gc
import weakref

from tally import LLM
from tally.engine import frozen_heap
from tally.engine.async_engine import AsyncEngine


class Node:
    pass


def test_a_serving_engine_is_frozen_until_it_stops() -> None:
    before = gc.get_freeze_count()  # whatever an earlier test in this process left
    engine = LLM(None, max_model_len=256, kv_cache_memory=64 << 20).engine
    assert gc.get_freeze_count() == before  # LLM() alone does not freeze: a process may load and drop many

    async def serve() -> int:
        served = AsyncEngine(engine)
        served.start()
        frozen = gc.get_freeze_count()
        served.stop()
        return frozen

    assert asyncio.run(serve()) > before + 10_000
    assert gc.get_freeze_count() == 0


def test_a_frozen_cycle_is_collected_once_thawed() -> None:
    node = Node()
    node.itself = node  # a cycle: only the collector frees it, and only unfrozen
    gone = weakref.ref(node)
    frozen_heap.freeze()
    try:
        del node
        gc.collect()
        assert gone() is not None  # frozen: the collector does not look at it
    finally:
        frozen_heap.thaw()
    assert gone() is None
