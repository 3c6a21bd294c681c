"""A model's weights moved into one arena on transparent huge pages, which a decode step streams faster than 4 KB
pages (fewer TLB misses, each of which walks two page tables in a VM: docs/benchmarks.md#decode-roofline).

Linux gives huge pages under THP "madvise" (the common default) only where a program asks, so the weights are copied
into one arena advised MADV_HUGEPAGE before anything takes their addresses; each tensor keeps its identity
(`Tensor.set_`). The moved tensors share one storage: copy layers before moving them (path_timing does).
"""
from __future__ import annotations

import ctypes
import itertools
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from tally.platform import libc_function

HUGE_PAGE = 2 << 20  # x86-64's and most arm64 kernels' PMD size; a smaller page elsewhere only wastes the alignment
MADV_HUGEPAGE = 14  # the same number on every Linux architecture
MADV_COLLAPSE = 25  # Linux 6.1 on; the same number on every architecture
MIN_BYTES = 64 << 10  # norms and biases stay where they are: a few pages, read once a layer
ALIGN = 64  # each weight starts on a cache line, as the allocator gives it
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
SMAPS = Path("/proc/self/smaps")


def _madvise() -> Callable[[int, int, int], int] | None:
    fn = libc_function("madvise")
    if fn is not None:
        fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return fn


def thp_setting() -> str:
    """The kernel's THP mode ("always", "madvise", "never"), or "unavailable"."""
    try:
        return THP_SETTING.read_text().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return "unavailable"


def mapping_fields(address: int) -> dict[str, str]:
    """/proc/self/smaps' fields (AnonHugePages, VmFlags, ...) of the mapping holding `address`; {} where none does
    or smaps cannot be read."""
    fields: dict[str, str] | None = None
    try:
        lines = SMAPS.read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        head, _, rest = line.partition(" ")
        if ":" not in head:  # a mapping's first line: "start-end perms offset dev inode path"
            if fields is not None:
                break
            lo, hi = (int(x, 16) for x in head.split("-"))
            fields = {} if lo <= address < hi else None
        elif fields is not None:
            fields[head[:-1]] = rest.strip()
    return fields or {}


def huge_page_buffer(nbytes: int) -> torch.Tensor | None:
    """uint8 [nbytes], untouched, starting on a huge-page boundary and advised MADV_HUGEPAGE; None where the kernel
    gives no huge pages on request."""
    advise = _madvise()
    if advise is None or thp_setting() not in ("always", "madvise"):
        return None
    span = -(-nbytes // HUGE_PAGE) * HUGE_PAGE
    arena = torch.empty(span + HUGE_PAGE, dtype=torch.uint8)  # room to start on a boundary
    lead = -arena.data_ptr() % HUGE_PAGE
    if advise(arena.data_ptr() + lead, span, MADV_HUGEPAGE) != 0:
        return None
    return arena[lead:lead + nbytes]


def collapse_to_huge_pages(buffer: torch.Tensor) -> bool:
    """Asks the kernel to back huge_page_buffer's `buffer` with huge pages now (MADV_COLLAPSE): a fault that found no
    free 2 MB page at that moment left 4 KB ones, which the collapse replaces, compacting memory to find the 2 MB
    pages (a multi-gigabyte arena, an MoE model's, meets such faults). Whether the kernel did it for the whole range;
    False where it cannot (before Linux 6.1, or no memory to compact into huge pages): the 4 KB pages stay."""
    advise = _madvise()
    span = -(-buffer.numel() // HUGE_PAGE) * HUGE_PAGE  # huge_page_buffer's allocation holds the whole last page
    return advise is not None and advise(buffer.data_ptr(), span, MADV_COLLAPSE) == 0


def move_weights_to_huge_pages(module: nn.Module) -> int:
    """Every CPU parameter and buffer of `module` of MIN_BYTES or more into one huge_page_buffer; returns how many of
    the moved bytes the kernel backs with huge pages, as smaps says (0 where there are none to have: nothing moves
    then; fewer than moved where it found no free 2 MB pages). Tensors sharing storage still share it afterwards.
    Storage torch did not allocate (a file mapping) stays where it is."""
    by_storage: dict[int, list[torch.Tensor]] = {}
    seen: set[int] = set()
    for t in itertools.chain(module.parameters(), module.buffers()):
        storage = t.untyped_storage()
        if id(t) in seen or t.device.type != "cpu" or not storage.resizable() or storage.nbytes() < MIN_BYTES:
            continue
        seen.add(id(t))
        by_storage.setdefault(storage.data_ptr(), []).append(t)
    slots, total = [], 0
    for tensors in by_storage.values():
        slots.append(total)
        total += -(-tensors[0].untyped_storage().nbytes() // ALIGN) * ALIGN
    arena = huge_page_buffer(total) if total else None
    if arena is None:
        return 0
    with torch.no_grad():
        for slot, tensors in zip(slots, by_storage.values()):
            old = tensors[0].untyped_storage()
            arena[slot:slot + old.nbytes()].copy_(torch.empty(0, dtype=torch.uint8).set_(old))
            start = arena.storage_offset() + slot
            for t in tensors:
                t.set_(arena.untyped_storage(), start // t.element_size() + t.storage_offset(), t.shape, t.stride())
    trim = libc_function("malloc_trim")
    if trim is not None:  # glibc keeps the old copies' freed pages: without this the process holds its weights twice
        trim(0)           # until the engine's first trim (tally/engine/heap_trim.py)
    if _huge_bytes(arena) < total:
        collapse_to_huge_pages(arena)
    return min(total, _huge_bytes(arena))  # an adjacent advised mapping (a draft model's arena) may share its line


def _huge_bytes(buffer: torch.Tensor) -> int:
    """The bytes smaps says are on huge pages in the mapping holding `buffer`."""
    return int(mapping_fields(buffer.data_ptr()).get("AnonHugePages", "0 kB").split()[0]) * 1024
