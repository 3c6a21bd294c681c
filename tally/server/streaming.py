"""Streaming: deltas computed from the engine's cumulative outputs, the SSE framings (OpenAI's `data: {json}`
chunks closed by `[DONE]`, or named `event:` lines as Anthropic's API and the Responses API send), and a response that
always closes its event generator, so a request whose client went away is aborted at once, not at garbage
collection."""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import AsyncIterator, Iterator

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from tally.errors import TallyError, error_body
from tally.outputs import CompletionOutput, RequestOutput


def sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def named_sse(obj: dict) -> bytes:
    """An event named by its own `type` field, the framing of Anthropic's API and the Responses API."""
    return b"event: " + obj["type"].encode() + b"\n" + sse(obj)


@dataclass(frozen=True)
class Framing:
    """How one API writes its stream's events and its errors."""

    named: bool = False  # `event: <type>` lines before each `data:`
    done: bytes = b"data: [DONE]\n\n"  # written last, whatever happened
    error_body: Callable[[TallyError], dict] = error_body  # an error's JSON body, answered with its HTTP status
    stream_error: Callable[[TallyError], dict] = error_body  # an error as the event that ends a begun stream

    def frame(self, events: list[dict]) -> bytes:
        return b"".join(map(named_sse if self.named else sse, events))


OPENAI = Framing()


class EventStreamResponse(Response):
    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes]) -> None:
        # Like StreamingResponse, no Response.__init__: that would declare a Content-Length of 0.
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.events = events

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Disconnects are watched by the request's own task (serving.Inflight), not here:
        # ASGI allows one reader of `receive`.
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        try:
            async for chunk in self.events:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            pass  # the client is gone; closing the generator below aborts its request
        finally:
            await self.events.aclose()


@dataclass
class Delta:
    """What one choice gained since the last chunk sent for it."""

    prompt_index: int
    output: RequestOutput
    choice: CompletionOutput
    text: str
    token_start: int  # the first token not sent before
    first: bool  # no chunk was sent for this choice yet
    finish_reason: str | None  # set on the one chunk that finishes the choice


def deltas(sent: dict[tuple[int, int], tuple[int, int, bool]],
           outputs: list[RequestOutput | None]) -> Iterator[Delta]:
    """Deltas from cumulative outputs; `sent` remembers (chars, tokens, finished) per (prompt, sample)."""
    for i, out in enumerate(outputs):
        if out is None:
            continue
        for c in out.outputs:
            key = (i, c.index)
            first = key not in sent
            chars, tokens, done = sent.get(key, (0, 0, False))
            finished = c.finish_reason is not None
            if done or (not first and len(c.text) <= chars and len(c.token_ids) == tokens and not finished):
                continue
            sent[key] = (max(chars, len(c.text)), len(c.token_ids), finished)
            yield Delta(i, out, c, c.text[chars:], tokens, first, c.finish_reason if finished else None)
