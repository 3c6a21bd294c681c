"""The ingress behind Ray's HTTP proxy (ray.llm calls its counterpart OpenAiIngress): reads each request whole,
forwards it to an engine replica through a handle whose router sees the prompt's leading text
(tally/deploy/ray_router.py), and streams the replica's response back unchanged.

Ray re-routes a request whose replica is gone before it accepts it; one accepted by a replica that then dies
fails at the handle. The client has seen nothing until the replica's first body bytes (the response start is held
back until then), so such a request is sent again, to a live replica, up to max_attempts times. GET /metrics is
answered here: every replica's series, merged (tally/deploy/ray_metrics.py), for a Host the replicas would serve."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST
from ray.exceptions import RayActorError
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from tally.deploy.ray_forward import ForwardedRequest, prompt_prefix
from tally.deploy.ray_metrics import merge_metrics
from tally.errors import EngineDeadError, TallyError
from tally.http_limits import read_body
from tally.server.allowed_hosts import AllowedHosts, AllowedHostsMiddleware
from tally.server.errors import error_body, error_response
from tally.server.streaming import sse

log = logging.getLogger("tally.deploy")
METRICS_TIMEOUT_S = 5.0  # a replica that does not answer within this is left out of one scrape


class OpenAiIngress:
    def __init__(self, server: DeploymentHandle, max_body_bytes: int, allowed_hosts: tuple[str, ...],
                 affinity_chars: int, max_attempts: int) -> None:
        """`allowed_hosts`: what each replica's app serves (tally/server/app_args.py:allowed_hosts)."""
        self.server = server
        self.streams = server.options(stream=True)
        self.max_body_bytes, self.allowed_hosts = max_body_bytes, allowed_hosts
        self.affinity_chars, self.max_attempts = affinity_chars, max_attempts

    async def __call__(self, request: Request) -> Response:
        path = request.scope["path"][len(request.scope.get("root_path", "")):] or "/"  # the app's own routes
        if request.method == "GET" and path == "/metrics":
            return HostChecked(self.allowed_hosts, self.metrics)
        try:
            body = await read_body(request, self.max_body_bytes)
        except TallyError as exc:
            return error_response(exc)
        forwarded = ForwardedRequest(request.method, path, request.scope["query_string"],
                                     tuple(map(tuple, request.scope["headers"])), body, request.scope.get("client"),
                                     prompt_prefix(body, self.affinity_chars))
        for attempt in range(1, self.max_attempts + 1):
            messages = self.streams.serve_http.remote(forwarded)
            try:
                head = await _head(messages)
            except RayActorError as exc:
                log.warning("the replica of %s %s died before answering (try %d of %d): %s", request.method,
                            path, attempt, self.max_attempts, exc)
                continue
            except asyncio.CancelledError:  # the client went away: the replica's app aborts its engine requests
                messages.cancel()
                raise
            return ForwardedResponse(head, messages)
        return error_response(EngineDeadError(f"{self.max_attempts} replicas in turn died before answering this "
                                              f"request; see the Ray Serve logs of the LLMServer deployment"))

    async def metrics(self) -> Response:
        results = await self.server.broadcast("metric_families").results_async(timeout_s=METRICS_TIMEOUT_S,
                                                                                return_exceptions=True)
        return Response(merge_metrics(r for r in results if not isinstance(r, BaseException)),
                        media_type=CONTENT_TYPE_LATEST)


class HostChecked(Response):
    """`respond()`'s response, for a Host the replicas serve; the check is the middleware a single `tally serve`
    puts in front of its app (tally/server/app.py), with the same list, so any other Host gets the same 400 and is
    asked nothing of the replicas."""

    def __init__(self, allowed_hosts: tuple[str, ...], respond: Callable[[], Awaitable[Response]]) -> None:
        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            await (await respond())(scope, receive, send)

        self.app = AllowedHostsMiddleware(app, AllowedHosts(allowed_hosts))  # "*": every Host
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


async def _head(messages: DeploymentResponseGenerator) -> list[Message]:
    """The replica's messages up to its first body bytes (or the end of the response)."""
    head = []
    async for message in messages:
        head.append(message)
        if message["type"] == "http.response.body" and (message.get("body") or not message.get("more_body")):
            break
    return head


class ForwardedResponse(Response):
    """A replica's response: the messages held back, then the rest as the replica sends them."""

    def __init__(self, head: list[Message], rest: DeploymentResponseGenerator) -> None:
        self.head, self.rest = head, rest
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        for message in self.head:
            await send(message)
        if not self.head[-1].get("more_body"):
            return
        try:
            async for message in self.rest:
                await send(message)
        except asyncio.CancelledError:
            self.rest.cancel()
            raise
        except RayActorError:
            # Bytes are out, so no retry: end the body, with an error event where the client reads events.
            err = EngineDeadError("the replica serving this stream died; send the request again")
            start = dict(self.head[0].get("headers", ()))
            event = b"text/event-stream" in start.get(b"content-type", b"")
            await send({"type": "http.response.body", "more_body": False,
                        "body": sse(error_body(err)) + b"data: [DONE]\n\n" if event else b""})
