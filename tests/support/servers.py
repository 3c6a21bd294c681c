"""Starting the `tally serve` processes a test module needs, side by side."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

from tally.server.process import ServerProcess


@contextlib.contextmanager
def started(*servers: ServerProcess) -> Iterator[tuple[ServerProcess, ...]]:
    """The servers, started at once and healthy, stopped at the end (a failed start stops the others too). A start
    is a process importing torch and loading a model on one core: two start in about the time of one."""
    try:
        with ThreadPoolExecutor(len(servers)) as pool:
            list(pool.map(ServerProcess.start, servers))
        yield servers
    finally:
        for server in servers:
            server.stop()
