"""A process's children as Linux's /proc shows them: which of tally's worker modules each runs, and at which
priority, so that a test can say where a piece of work ran."""
from __future__ import annotations

import os
from pathlib import Path


def worker_niceness(parent_pid: int, module: str) -> dict[int, int]:
    """The nice value of each child of `parent_pid` that runs `python -m module`, by its process id."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rpartition(")")[2].split()[1])  # the name in parentheses may hold spaces
            argv = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):  # it exited meanwhile
            continue
        if ppid == parent_pid and module.encode() in argv:
            found[int(stat.parent.name)] = os.getpriority(os.PRIO_PROCESS, int(stat.parent.name))
    return found
