"""Free ports come from below the kernel's ephemeral range, where no outgoing connection can take them before the
server that asked binds them (CI lost a Ray Serve proxy's port to one)."""
from __future__ import annotations

import socket

from tally import ports
from tally.ports import FIRST_PORT, _ephemeral_start, free_port


def test_a_free_port_is_bindable_and_outside_the_ephemeral_range():
    ports = {free_port() for _ in range(20)}
    assert all(FIRST_PORT <= p < _ephemeral_start() for p in ports)
    port = ports.pop()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_a_port_in_use_is_never_handed_out(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", free_port()))
        held.listen()
        taken = held.getsockname()[1]
        # a range of two ports, the first one held: every draw must step past it
        monkeypatch.setattr(ports, "FIRST_PORT", taken)
        monkeypatch.setattr(ports, "_ephemeral_start", lambda: taken + 2)
        assert taken not in {free_port() for _ in range(50)}
