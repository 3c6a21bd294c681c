"""Waiting for a torch.distributed operation by polling it, for a bounded time, before blocking.

A blocking wait puts the rank's thread to sleep until gloo's network thread wakes it. A rank pinned to its own
core then leaves that core idle, and on a virtual machine an idle vCPU is halted: waking it goes through the
hypervisor and costs far more than the collective (docs/benchmarks.md#parallel). Polling keeps the core awake;
yielding lets gloo's own threads, which share that core, run. After `SPIN_S` the wait blocks, so an idle or dead peer
costs no CPU and the process group's timeout still applies.
"""
from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # importing this module needs no torch: `tally plan` imports the link probe without it
    import torch.distributed as dist

SPIN_S = 0.05  # longer than any collective of a step; shorter than a human notices as CPU spent idle


def wait_polling(work: dist.Work, spin_s: float = SPIN_S) -> None:
    deadline = time.perf_counter() + spin_s
    while not work.is_completed() and time.perf_counter() < deadline:
        os.sched_yield()
    work.wait()
