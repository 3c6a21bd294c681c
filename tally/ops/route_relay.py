"""How `tally route` passes a replica's answer on: a refusal whole, as the replica gave it (status, body,
Retry-After), and a stream event by event, so that a stream the replica breaks off (or the deadline cuts) ends
with an error event the client can read and `data: [DONE]`, never with half an event."""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable

import httpx
from starlette.responses import Response

from tally.errors import RequestTimeoutError, TallyError, error_body
from tally.ops.response_meter import ResponseMeter
from tally.ops.route_limits import ReplicaBrokeError

HOP_HEADERS = {"host", "content-length", "connection", "transfer-encoding", "keep-alive"}
MAX_ANSWER_BYTES = 64 * 2**10  # a refusal's body is an error message; past this it is cut
MAX_EVENT_BYTES = 2**20  # a stream without event boundaries this long is passed on as it comes


def passed_headers(upstream: httpx.Response) -> dict[str, str]:
    """The replica's headers, but those of its own connection; raw bytes go through, so Content-Encoding goes
    with them."""
    return {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS}


async def whole_answer(upstream: httpx.Response, deadline_s: float) -> Response:
    """The replica's answer read whole (up to MAX_ANSWER_BYTES), to be passed on later; a read the replica breaks
    off, or that the deadline (event loop time) cuts, passes on what came."""
    body = b""
    try:
        async with asyncio.timeout_at(deadline_s):
            async for chunk in upstream.aiter_raw():
                body += chunk
                if len(body) >= MAX_ANSWER_BYTES:
                    break
    except (httpx.HTTPError, TimeoutError):
        pass
    finally:
        await upstream.aclose()
    return Response(body[:MAX_ANSWER_BYTES], status_code=upstream.status_code, headers=passed_headers(upstream))


def is_event_stream(upstream: httpx.Response) -> bool:
    """An SSE stream the router can end itself: one it can read (not compressed)."""
    return upstream.headers.get("content-type", "").startswith("text/event-stream") and \
        upstream.headers.get("content-encoding", "identity") in ("", "identity")


class EventFramer:
    """Holds back the bytes after a stream's last complete event (`\\n\\n` or `\\r\\n\\r\\n`) until the event is
    complete, so the bytes passed on always end on an event's boundary."""

    def __init__(self) -> None:
        self.pending = b""

    def complete(self, chunk: bytes) -> bytes:
        data = self.pending + chunk
        lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\r\n\r\n")
        end = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
        if end == 0 and len(data) > MAX_EVENT_BYTES:
            end = len(data)
        self.pending = data[end:]
        return data[:end]


def stream_end(err: TallyError) -> bytes:
    """The last events of a stream the router ends: OpenAI's error event (its client raises it), then [DONE]."""
    return b"data: " + json.dumps(error_body(err)).encode() + b"\n\ndata: [DONE]\n\n"


async def relay(upstream: httpx.Response, deadline_s: float, timeout_s: float, meter: ResponseMeter | None,
                done: Callable[[str], None]) -> AsyncIterator[bytes]:
    """The replica's bytes as they come, until its end or the request's deadline (event loop time; `timeout_s` is
    the flag's value, for the message); an event stream the replica breaks off, or the deadline cuts, ends with an
    error event, a body of another kind can only be cut. `done` is told the outcome: ok, broken, timeout or
    client_gone."""
    outcome = "client_gone"  # unless the stream ends, the replica breaks it or the deadline passes
    framer = EventFramer() if is_event_stream(upstream) else None
    chunks = upstream.aiter_raw()
    try:
        while True:
            try:
                async with asyncio.timeout_at(deadline_s):
                    chunk = await anext(chunks)
            except StopAsyncIteration:
                break
            arrived_s = time.monotonic()
            whole = framer.complete(chunk) if framer is not None else chunk
            if whole:
                yield whole
                if meter is not None:  # read after the client has the bytes: never in their way
                    meter.feed(whole, arrived_s)
        if framer is not None and framer.pending:
            yield framer.pending
        outcome = "ok"
    except (httpx.HTTPError, TimeoutError) as e:
        outcome = "timeout" if isinstance(e, TimeoutError) else "broken"
        if framer is None:
            raise
        yield stream_end(RequestTimeoutError(f"the answer did not finish within --request-timeout {timeout_s:g} s; "
                                             f"it is cut short") if outcome == "timeout" else
                         ReplicaBrokeError(f"the replica broke off the stream ({type(e).__name__}); the answer is "
                                           f"incomplete"))
    finally:
        await upstream.aclose()
        done(outcome)
