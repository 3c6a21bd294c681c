"""Starting the `tally serve` processes a test module needs, side by side."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, wait

from tally.server.process import ServerProcess


@contextlib.contextmanager
def started(*servers: ServerProcess) -> Iterator[tuple[ServerProcess, ...]]:
    """The servers, started at once and healthy, stopped at once at the end (a failed start stops the others too).
    A start is a process importing torch and loading a model on one core, and a stop mostly the interpreter's own
    exit: two take about the time of one on two cores."""
    with ThreadPoolExecutor(len(servers)) as pool:
        starts = [pool.submit(server.start) for server in servers]
        wait(starts)  # every one healthy or failed before any is stopped
        try:
            for start in starts:
                start.result()
            yield servers
        finally:
            list(pool.map(ServerProcess.stop, servers))
