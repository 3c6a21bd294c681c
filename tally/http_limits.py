"""The limits an HTTP front holds against its clients, shared by `tally serve` and `tally route`: a cap on open
connections and a deadline for a request's headers (uvicorn's protocol class), a body read within a size and a
time limit. A JSON body's nesting is measured by tally/json_text.py before anything parses it."""
from __future__ import annotations

import asyncio

from starlette.requests import Request
from uvicorn.protocols.http.h11_impl import H11Protocol

from tally.errors import BodyTimeoutError, BodyTooLargeError

BODY_TIMEOUT_S = 60.0


class GuardedH11Protocol(H11Protocol):
    """Half-open connections and clients that send a byte a second would hold file descriptors until the process
    reaches its descriptor limit. uvicorn's own `limit_concurrency` answers 503 only once headers have arrived, and
    its keep-alive timeout restarts with every byte received, so both limits live here: a connection over the cap
    is closed as it is accepted; one that has not sent a request's complete headers within `header_timeout_s` of
    opening, or of its previous answer's end, is closed."""
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
        self._await_headers()

    def _await_headers(self) -> None:
        self._answered = self.cycle  # the request before the awaited one; None on a new connection
        self._header_deadline = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def handle_events(self) -> None:
        super().handle_events()
        if self._header_deadline is not None and self.cycle is not self._answered:  # the awaited headers arrived
            self._header_deadline.cancel()
            self._header_deadline = None

    def on_response_complete(self) -> None:
        answered = self.cycle
        super().on_response_complete()  # may already read a pipelined request
        if self.cycle is answered and self._header_deadline is None and not self.transport.is_closing():
            self._await_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
        super().connection_lost(exc)

    def _headers_too_slow(self) -> None:
        self._header_deadline = None
        if self.cycle is self._answered and not self.transport.is_closing():
            self.transport.close()


def guarded_protocol(max_connections: int, header_timeout_s: float) -> type[GuardedH11Protocol]:
    """The protocol class uvicorn instantiates per connection, with these limits."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,),
                {"max_connections": max_connections, "header_timeout_s": header_timeout_s})


async def read_body(request: Request, limit_bytes: int, timeout_s: float = BODY_TIMEOUT_S) -> bytes:
    """The whole body, refused when it is larger than `limit_bytes` (by its declared length before reading, else as
    soon as the bytes read pass it) or slower than `timeout_s`."""
    declared = request.headers.get("content-length")
    too_big = BodyTooLargeError(f"request body exceeds the limit of {limit_bytes:,} bytes; "
                                f"send a shorter prompt or raise --max-body-bytes")
    if declared is not None and declared.isdigit() and int(declared) > limit_bytes:
        raise too_big
    parts, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):  # a body sent a byte a second would hold a connection forever
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit_bytes:
                    raise too_big
                parts.append(chunk)
    except TimeoutError:
        raise BodyTimeoutError(f"the request body did not arrive within {timeout_s:g} s") from None
    return b"".join(parts)

