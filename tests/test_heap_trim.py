"""The engine thread hands the C heap's free pages back to the OS, at most once an interval."""
from __future__ import annotations

import ctypes
import threading

import pytest

from tally.engine.heap_trim import HeapTrimmer

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
CHUNK, CHUNKS = 64 * 1024, 1600  # 100 MiB in chunks under glibc's mmap threshold: they live in an arena


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _fragment_an_arena() -> int:
    """Fill 100 MiB of a thread's arena, keep one chunk above it, free the rest: the free pages sit below a live
    chunk, so free() alone cannot give them back. Returns the live chunk."""
    box: list[int] = []

    def run() -> None:
        chunks = [libc.malloc(CHUNK) for _ in range(CHUNKS)]
        for c in chunks:
            ctypes.memset(c, 1, CHUNK)  # touch the pages, so they count in RSS
        box.append(libc.malloc(CHUNK))
        for c in chunks:
            libc.free(c)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    return box[0]


@pytest.mark.skipif(not HeapTrimmer().available, reason="malloc_trim is glibc's")
def test_a_trim_gives_a_fragmented_arena_back():
    pinned = _fragment_an_arena()
    before = _rss_bytes()
    trimmer = HeapTrimmer(interval_s=0)
    trimmer.maybe_trim()
    assert trimmer.num_trims == 1
    assert before - _rss_bytes() > 50 * 2**20  # most of the 100 MiB
    libc.free(pinned)


def test_trims_wait_for_the_interval():
    trimmer = HeapTrimmer(interval_s=3600)
    for _ in range(100):
        trimmer.maybe_trim()
    assert trimmer.num_trims == 0
