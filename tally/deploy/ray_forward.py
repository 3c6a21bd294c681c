"""The hop from the ingress to an engine replica: the HTTP request as data (ForwardedRequest), with the leading
text of its prompt for the router to see (Ray's HTTP proxy hands routers no body), and the replica's side of it:
the request run through Tally's own ASGI app, its ASGI messages yielded as they are sent."""
from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.types import ASGIApp, Message


@dataclass(frozen=True)
class ForwardedRequest:
    method: str
    path: str
    query_string: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    client: tuple[str, int] | None
    prompt_prefix: str | None  # the prompt's first affinity_chars characters; None when the prompt is shorter


def prompt_prefix(body: bytes, affinity_chars: int) -> str | None:
    """The first `affinity_chars` characters of a completion's prompt or a chat's messages (role and content, in
    order); None when the text is shorter (no prefix worth keeping in one replica's cache) or the body is not a
    generation request (the replica answers it with the real error)."""
    try:
        req = json.loads(body)
    except ValueError:
        return None
    if not isinstance(req, dict):
        return None
    if isinstance(req.get("messages"), list):
        text = "".join(f"{m.get('role')}\n{_text(m.get('content'))}\n" for m in req["messages"] if isinstance(m, dict))
    else:
        prompt = req.get("prompt")
        text = _text(prompt[0] if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int)
                     else prompt)
    return text[:affinity_chars] if len(text) >= affinity_chars else None


def _text(content: object) -> str:
    """Text of a message content (a string or OpenAI's parts) or a prompt (a string or token ids)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else f"{p} " for p in content)
    return ""


async def run_asgi(app: ASGIApp, request: ForwardedRequest) -> AsyncIterator[Message]:
    """Yields the app's response messages to `request`. Closing the iterator early is the client going away:
    the app's task is cancelled, which aborts its engine requests (as a drain timeout does)."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "scheme": "http",
             "method": request.method, "path": request.path, "raw_path": request.path.encode(),
             "query_string": request.query_string, "root_path": "", "headers": list(request.headers),
             "client": request.client, "server": None, "state": {}}
    sent: asyncio.Queue[Message | None] = asyncio.Queue()
    body_given = False

    async def receive() -> Message:
        nonlocal body_given
        if body_given:
            await asyncio.get_running_loop().create_future()  # the body was whole; wait to be cancelled
        body_given = True
        return {"type": "http.request", "body": request.body, "more_body": False}

    async def run() -> None:
        try:
            await app(scope, receive, sent.put)
        finally:
            sent.put_nowait(None)

    task = asyncio.ensure_future(run())
    try:
        while (message := await sent.get()) is not None:
            yield message
        await task  # the app's own exception, if it raised one
    finally:
        task.cancel()
