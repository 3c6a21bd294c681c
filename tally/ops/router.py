"""`tally route`'s proxy: `/v1/*` in front of replicas, streaming-safe.

- **Balancing**: the healthy replica with the fewest requests in flight (then the fewest served); requests that share a prompt prefix (a
  chat's system message, or a completion's first PREFIX_CHARS characters) prefer the same replica, so its prefix
  cache hits, unless that replica has AFFINITY_SLACK more in flight than the least loaded one.
- **Health**: every replica's `/health` is polled each `health_interval_s`; one that fails it (or refuses a
  connection) is out until it answers again.
- **Failover**: a request whose replica cannot be reached, or answers 5xx before any byte went to the client, is
  sent to the next replica; once a byte was streamed it is the client's, and a failure ends the stream.
- Bodies and streams pass through byte for byte; the proxy's own `/metrics` counts requests by replica and outcome.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

PREFIX_CHARS = 256
AFFINITY_SLACK = 2
HOP_HEADERS = {"host", "content-length", "connection", "transfer-encoding", "keep-alive"}


@dataclass
class Replica:
    url: str
    healthy: bool = True
    in_flight: int = 0
    served: int = 0
    failed: int = 0
    last_check_s: float = 0.0
    last_error: str | None = None


@dataclass
class RouterConfig:
    replicas: list[str]
    health_interval_s: float = 1.0
    request_timeout_s: float = 600.0


@dataclass
class Router:
    config: RouterConfig
    replicas: list[Replica] = field(init=False)

    def __post_init__(self) -> None:
        self.replicas = [Replica(u.rstrip("/")) for u in self.config.replicas]

    def order(self, affinity_key: str | None) -> list[Replica]:
        """Replicas to try, best first: healthy ones by load (the affine one first when not much busier), then
        the unhealthy ones as a last resort."""
        # Ties (an idle fleet) go to the replica that has served least, so sequential requests alternate.
        healthy = sorted((r for r in self.replicas if r.healthy), key=lambda r: (r.in_flight, r.served))
        if affinity_key is not None and healthy:
            ring = sorted(self.replicas, key=lambda r: r.url)
            affine = ring[int(hashlib.sha1(affinity_key.encode()).hexdigest(), 16) % len(ring)]
            if affine.healthy and affine.in_flight <= healthy[0].in_flight + AFFINITY_SLACK:
                healthy = [affine] + [r for r in healthy if r is not affine]
        return healthy + [r for r in self.replicas if not r.healthy]


def affinity_key(body: bytes) -> str | None:
    """What requests sharing a prefix have in common: the system message, else the prompt's start."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    messages = data.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[0], dict):
        first = messages[0]
        return json.dumps(first.get("content"))[:PREFIX_CHARS] if first.get("role") == "system" else None
    prompt = data.get("prompt")
    return prompt[:PREFIX_CHARS] if isinstance(prompt, str) and len(prompt) >= PREFIX_CHARS else None


def build_router_app(config: RouterConfig) -> Starlette:
    router = Router(config)
    registry = CollectorRegistry()
    requests = Counter("tally_route_requests", "Requests the proxy handled, by replica and outcome.",
                       ["replica", "outcome"], registry=registry)
    in_flight = Gauge("tally_route_in_flight", "Requests in flight, by replica.", ["replica"], registry=registry)
    healthy = Gauge("tally_route_replica_healthy", "1 while the replica passes its health check.", ["replica"],
                    registry=registry)
    client = httpx.AsyncClient(timeout=httpx.Timeout(config.request_timeout_s, connect=5.0))

    async def check(replica: Replica) -> None:
        try:
            ok = (await client.get(replica.url + "/health", timeout=max(config.health_interval_s, 0.5))).status_code \
                == 200
            replica.last_error = None if ok else "health check answered non-200"
        except httpx.HTTPError as e:
            ok, replica.last_error = False, f"health check failed: {type(e).__name__}"
        replica.healthy, replica.last_check_s = ok, time.time()
        healthy.labels(replica.url).set(1 if ok else 0)

    async def health_loop() -> None:
        while True:
            await asyncio.gather(*(check(r) for r in router.replicas))
            await asyncio.sleep(config.health_interval_s)

    async def proxy(request: Request) -> Response:
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        last = None
        for replica in router.order(affinity_key(body)):
            replica.in_flight += 1
            in_flight.labels(replica.url).inc()
            released = False

            def release(outcome: str, replica: Replica = replica) -> None:
                nonlocal released
                if not released:
                    released = True
                    replica.in_flight -= 1
                    in_flight.labels(replica.url).dec()
                    requests.labels(replica.url, outcome).inc()

            try:
                upstream = await client.send(client.build_request(request.method, replica.url + path,
                                                                  headers=headers, content=body), stream=True)
            except httpx.HTTPError as e:
                replica.healthy, replica.failed, replica.last_error = False, replica.failed + 1, type(e).__name__
                healthy.labels(replica.url).set(0)
                release("unreachable")
                last = e
                continue
            if upstream.status_code >= 500:  # nothing went to the client yet: another replica may do better
                await upstream.aclose()
                replica.failed += 1
                release(f"http_{upstream.status_code}")
                last = upstream
                continue
            replica.served += 1

            async def stream(upstream: httpx.Response = upstream, release=release) -> AsyncIterator[bytes]:
                try:
                    async for chunk in upstream.aiter_raw():
                        yield chunk
                    release("ok")
                except (httpx.HTTPError, asyncio.CancelledError):
                    release("broken")
                    raise
                finally:
                    await upstream.aclose()
                    release("client_gone")

            passed = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS
                      and k.lower() != "content-encoding"}
            return StreamingResponse(stream(), status_code=upstream.status_code, headers=passed)
        if isinstance(last, httpx.Response):
            return Response(status_code=last.status_code, content=b"", media_type="application/json")
        return JSONResponse({"error": {"message": "no replica could take the request (all unreachable)",
                                       "type": "service_unavailable", "code": 503}}, status_code=503,
                            headers={"Retry-After": "1"})

    async def health(_: Request) -> Response:
        ok = any(r.healthy for r in router.replicas)
        return JSONResponse({"healthy_replicas": sum(r.healthy for r in router.replicas)},
                            status_code=200 if ok else 503)

    async def status(_: Request) -> Response:
        return JSONResponse({"replicas": [vars(r) for r in router.replicas]})

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        task = asyncio.create_task(health_loop())
        try:
            yield
        finally:
            task.cancel()
            await client.aclose()

    return Starlette(routes=[
        Route("/health", health), Route("/metrics", metrics), Route("/router/status", status),
        Route("/v1/{rest:path}", proxy, methods=["GET", "POST"]),
    ], lifespan=lifespan)
