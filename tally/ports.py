"""A free local TCP port for a server this process is about to start (tests, benchmarks, the link probe).

A port from bind(("127.0.0.1", 0)) lies in the kernel's ephemeral range, the range every outgoing connection on the
machine takes its local port from: between choosing it and the server binding it, anything that connects may take
it (a Ray cluster starting in that gap opens hundreds of connections: "Failed to bind to address"). Ports are
therefore drawn below the ephemeral range and above Ray's worker ports (10002-19999), where only a server binding on
purpose can collide, and the bind check catches one already there.
"""
from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
FIRST_PORT = 20000  # above Ray's default worker ports
DRAWS = 200


def _ephemeral_start() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default; elsewhere the draw still checks each port by binding it


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    last = _ephemeral_start() - 1
    if last > FIRST_PORT:
        for port in random.sample(range(FIRST_PORT, last + 1), min(DRAWS, last + 1 - FIRST_PORT)):
            if _bindable(port):
                return port
    with socket.socket() as s:  # no room below the ephemeral range (or all taken): the kernel's choice
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
