"""Connection-level limits uvicorn leaves open: a cap on open connections, and a deadline for a request's headers.

Without them, half-open connections and clients that send a byte a second hold file descriptors until the server
reaches its descriptor limit. uvicorn's own `limit_concurrency` answers 503 only once headers have arrived, and its
keep-alive timeout starts only after a first response, so both limits live here, in its HTTP protocol class: a
connection over the cap is closed as it is accepted; one whose first request's headers are not complete within
`header_timeout_s` is closed.
"""
from __future__ import annotations

import asyncio

from uvicorn.protocols.http.h11_impl import H11Protocol


class GuardedH11Protocol(H11Protocol):
    max_connections = 1024
    header_timeout_s = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_deadline: asyncio.TimerHandle | None = None
        if len(self.connections) > self.max_connections:
            self.logger.warning("closing a connection: %d are open (--max-connections %d)",
                                len(self.connections), self.max_connections)
            transport.close()
            return
        self._header_deadline = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not None and self._header_deadline is not None:  # the first request's headers arrived
            self._header_deadline.cancel()
            self._header_deadline = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
        super().connection_lost(exc)

    def _headers_too_slow(self) -> None:
        self._header_deadline = None
        if self.cycle is None and not self.transport.is_closing():
            self.transport.close()


def guarded_protocol(max_connections: int, header_timeout_s: float) -> type[GuardedH11Protocol]:
    """The protocol class uvicorn instantiates per connection, with this server's limits."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,),
                {"max_connections": max_connections, "header_timeout_s": header_timeout_s})
