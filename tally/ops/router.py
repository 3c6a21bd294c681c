"""`tally route`'s proxy: `/v1/*` (and a Tally or vLLM server's `/tokenize`, `/detokenize`) in front of replicas,
streaming-safe."""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from dataclasses import dataclass, field

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tally.errors import InvalidRequestError, RequestTimeoutError, TallyError
from tally.ops.canary import CANARY, STABLE, Canary, CanaryConfig
from tally.ops.canary_rules import Sample
from tally.ops.response_meter import ResponseMeter
from tally.ops.route_length import bound_need, exact_need
from tally.ops.route_limits import NoReplicaError, RouteLimits, error_response, read_request
from tally.ops.route_pools import MAIN, Need, PoolsConfig, pool_order
from tally.ops.route_relay import HOP_HEADERS, passed_headers, relay, whole_answer

log = logging.getLogger("tally.route")
PREFIX_CHARS = 256
AFFINITY_SLACK = 2


@dataclass
class Replica:
    url: str
    side: str = STABLE
    pool: str = MAIN
    max_model_len: int | None = None  # from its /v1/models, read whenever it comes up
    healthy: bool = True
    in_flight: int = 0
    served: int = 0
    failed: int = 0
    last_check_s: float = 0.0
    last_error: str | None = None


@dataclass
class RouterConfig:
    pools: PoolsConfig
    health_interval_s: float = 1.0
    canary: CanaryConfig | None = None
    limits: RouteLimits = field(default_factory=RouteLimits)
    canary_pool: str | None = None  # the pool the canary's replicas join; None: the main pool

    @property
    def pool_of_canary(self) -> str:
        return self.canary_pool or self.pools.main_pool


@dataclass
class Router:
    """The proxy's rules:

    - **Balancing**: the healthy replica with the fewest requests in flight (then the fewest served); requests that
      share a prompt prefix (a chat's system message, or a completion's first PREFIX_CHARS characters) prefer the
      same replica, so its prefix cache hits, unless that replica has AFFINITY_SLACK more in flight than the least
      loaded one.
    - **Health**: every replica's `/health` is polled each `health_interval_s`; one that fails it (or refuses a
      connection) is out until it answers again.
    - **Failover**: a request whose replica cannot be reached, or answers 5xx before any byte went to the client, is
      sent to the next replica; when none does better, the last 5xx is passed on as the replica gave it (status,
      body, Retry-After). Once a byte was streamed it is the client's: a stream its replica breaks off ends with an
      error event and `[DONE]` (tally/ops/route_relay.py).
    - **Limits** (tally/ops/route_limits.py): the client's headers, body size, body time and nesting, as
      `tally serve` holds them; one deadline for the whole request, a stream's last byte included.
    - Bodies and streams pass through byte for byte; the proxy's own `/metrics` counts requests by replica and outcome.
    - **Canary** (tally/ops/canary.py), when configured: it picks each request's side (canary or stable) and is handed
      what the proxy measured of every generation response (tally/ops/response_meter.py); balancing and failover
      work within that side first, then the other — a rolled-back canary is never tried. While it runs, every
      backend's `/metrics` is scraped once per evaluation interval, one loop per backend, so a slow or missing one
      never delays an evaluation (tally/ops/backend_metrics.py). The canary belongs to one pool (`canary_pool`) and
      is judged against that pool's stable replicas; requests routed to another pool never reach it.
    - **Length pools** (tally/ops/route_pools.py), when a long pool is named: each generation request goes to the
      pool its tokens (prompt + max_tokens, tally/ops/route_length.py) call for, balanced and failed over within
      that pool first, then within the other one if it can hold the request."""
    config: RouterConfig
    replicas: list[Replica] = field(init=False)

    def __post_init__(self) -> None:
        canary = self.config.canary.urls if self.config.canary else ()
        self.replicas = [Replica(u, pool=name) for name, urls in self.config.pools.pools for u in urls] + [
            Replica(u, CANARY, self.config.pool_of_canary) for u in canary]

    def max_model_lens(self) -> dict[str, int | None]:
        """Each pool's max_model_len: the least its replicas report (None until one has)."""
        known: dict[str, int | None] = {name: None for name, _ in self.config.pools.pools}
        for r in self.replicas:
            if r.max_model_len is not None:
                known[r.pool] = min(r.max_model_len, known[r.pool] or r.max_model_len)
        return known

    def order(self, affinity_key: str | None, sides: tuple[str, ...] = (STABLE,),
              pools: list[str] | None = None) -> list[Replica]:
        """Replicas to try, best first: each pool's (default: all) and within it each side's healthy ones in turn,
        by load (the affine one first when not much busier), then the unhealthy ones as a last resort. Replicas of
        a side or pool not named are never tried."""
        healthy, unhealthy = [], []
        for pool, side in ((p, s) for p in (pools or [name for name, _ in self.config.pools.pools]) for s in sides):
            mine = [r for r in self.replicas if r.side == side and r.pool == pool]
            # Ties (an idle fleet) go to the replica that has served least, so sequential requests alternate.
            ranked = sorted((r for r in mine if r.healthy), key=lambda r: (r.in_flight, r.served))
            if affinity_key is not None and ranked:
                ring = sorted(mine, key=lambda r: r.url)
                affine = ring[int(hashlib.sha1(affinity_key.encode()).hexdigest(), 16) % len(ring)]
                if affine.healthy and affine.in_flight <= ranked[0].in_flight + AFFINITY_SLACK:
                    ranked = [affine] + [r for r in ranked if r is not affine]
            healthy += ranked
            unhealthy += [r for r in mine if not r.healthy]
        return healthy + unhealthy


class IndentedJSON(JSONResponse):
    """The router's own pages, indented for a person reading them with curl."""

    def render(self, content: object) -> bytes:
        return json.dumps(content, indent=2, ensure_ascii=False, allow_nan=False).encode() + b"\n"


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


async def served_max_model_len(client: httpx.AsyncClient, url: str) -> int | None:
    """The context a replica serves, as its /v1/models says (Tally and vLLM both give `max_model_len`)."""
    try:
        data = (await client.get(url + "/v1/models", timeout=5.0)).json()["data"]
        value = data[0].get("max_model_len")
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None
    return value if isinstance(value, int) and value > 0 else None


def build_router_app(config: RouterConfig) -> Starlette:
    router = Router(config)
    registry = CollectorRegistry()
    requests = Counter("tally_route_requests", "Requests the proxy handled, by replica and outcome.",
                       ["replica", "outcome"], registry=registry)
    in_flight = Gauge("tally_route_in_flight", "Requests in flight, by replica.", ["replica"], registry=registry)
    healthy = Gauge("tally_route_replica_healthy", "1 while the replica passes its health check.", ["replica"],
                    registry=registry)
    pool_requests = Counter("tally_route_pool_requests", "Generation requests by the pool their length chose.",
                            ["pool"], registry=registry)
    pool_refused = Counter("tally_route_pool_refused", "Requests refused because no pool's max_model_len holds "
                           "them.", registry=registry)
    pools = config.pools
    routed = {name: 0 for name, _ in pools.pools}
    limits = config.limits
    # One deadline bounds each request as a whole (proxy, relay); httpx's would bound each read alone.
    client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5.0))
    canary = Canary(config.canary, time.monotonic(), registry, tuple(
        r.url for r in router.replicas if r.side == STABLE and r.pool == config.pool_of_canary)) \
        if config.canary else None

    async def check(replica: Replica) -> None:
        try:
            ok = (await client.get(replica.url + "/health", timeout=max(config.health_interval_s, 0.5))).status_code \
                == 200
            replica.last_error = None if ok else "health check answered non-200"
        except httpx.HTTPError as e:
            ok, replica.last_error = False, f"health check failed: {type(e).__name__}"
        if ok and (not replica.healthy or replica.max_model_len is None):  # it may have restarted with another
            replica.max_model_len = await served_max_model_len(client, replica.url)
        if ok != replica.healthy:
            log.log(logging.INFO if ok else logging.WARNING, "replica %s %s", replica.url,
                    "is back: it passes its health check" if ok else f"is out: {replica.last_error}")
        replica.healthy, replica.last_check_s = ok, time.time()
        healthy.labels(replica.url).set(1 if ok else 0)

    async def health_loop() -> None:
        while True:
            await asyncio.gather(*(check(r) for r in router.replicas))
            await asyncio.sleep(config.health_interval_s)

    async def canary_loop(canary: Canary) -> None:
        while canary.running:
            await asyncio.sleep(canary.config.eval_interval_s)
            try:
                canary.evaluate(time.monotonic())
            except Exception as exc:  # whatever broke, the canary must not run unwatched
                log.exception("canary evaluation failed")
                canary.fail_safe(repr(exc))

    async def scrape_loop(canary: Canary, url: str) -> None:
        interval_s = canary.config.eval_interval_s
        while canary.running:
            try:
                await canary.backends.scrape(client, url, time.monotonic, timeout_s=max(1.0, min(5.0, interval_s)))
            except Exception as exc:  # an odd /metrics page is no data, never a dead loop
                canary.backends.fail(url, f"scrape failed: {exc!r}")
            await asyncio.sleep(interval_s)

    async def proxy(request: Request) -> Response:
        deadline_s = asyncio.get_running_loop().time() + limits.request_timeout_s
        try:
            body = await read_request(request, limits)
        except TallyError as e:
            return error_response(e)
        except ClientDisconnect:  # gone before its body was whole: nobody reads the answer
            return Response(status_code=499)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        generation = request.method == "POST" and request.url.path.startswith("/v1/")  # not /v1/models
        order = None
        if pools.long_pool is not None and generation:
            try:
                order = pool_order(pools, router.max_model_lens(), await need(body, request.url.path))
            except InvalidRequestError as e:
                pool_refused.inc()
                return error_response(e)
            pool_requests.labels(order[0]).inc()
            routed[order[0]] += 1
        sides, measured = (STABLE,), False
        if canary is not None and (order is None or order[0] == config.pool_of_canary):
            sticky = canary.config.sticky_header
            sides = canary.sides(request.headers.get(sticky) if sticky else None)
            measured = generation
        passed_over = None  # the last answer failover did not take, passed on if no replica does better
        for replica in router.order(affinity_key(body), sides, order):
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

            def failed(outcome: str, replica: Replica = replica) -> None:
                release(outcome)
                if measured and replica.pool == config.pool_of_canary:
                    canary.record(replica.side, Sample(time.monotonic(), error=True))

            sent_s = time.monotonic()
            try:
                async with asyncio.timeout_at(deadline_s):
                    upstream = await client.send(client.build_request(request.method, replica.url + path,
                                                                      headers=headers, content=body), stream=True)
            except TimeoutError:
                failed("timeout")
                return error_response(RequestTimeoutError(
                    f"no replica answered within --request-timeout {limits.request_timeout_s:g} s"))
            except httpx.HTTPError as e:
                if replica.healthy:
                    log.warning("replica %s is out: a request could not reach it (%s)", replica.url, type(e).__name__)
                replica.healthy, replica.failed, replica.last_error = False, replica.failed + 1, type(e).__name__
                healthy.labels(replica.url).set(0)
                failed("unreachable")
                continue
            if upstream.status_code >= 500:  # nothing went to the client yet: another replica may do better
                replica.failed += 1
                failed(f"http_{upstream.status_code}")
                passed_over = await whole_answer(upstream, deadline_s)
                continue
            replica.served += 1
            meter = ResponseMeter(sent_s, upstream.status_code, upstream.headers.get("content-type", ""),
                                  upstream.headers.get("content-encoding")) \
                if measured and replica.pool == config.pool_of_canary else None

            def done(outcome: str) -> None:
                release(outcome)
                if meter is not None and outcome != "client_gone":  # a client leaving says nothing of the replica
                    canary.record(replica.side, meter.sample(time.monotonic(), broken=outcome != "ok"))

            return StreamingResponse(relay(upstream, deadline_s, limits.request_timeout_s, meter, done),
                                     status_code=upstream.status_code, headers=passed_headers(upstream))
        if passed_over is not None:
            return passed_over
        return error_response(NoReplicaError("no replica could take the request (all unreachable)"))

    async def need(body: bytes, path: str) -> Need:
        """The request's need: the free bound when it is short and fits the main pool, else counted exactly by a
        healthy replica (the bound again if none can count it, which only ever sends it to a longer pool)."""
        bound, payload = bound_need(body, path)
        main_len = router.max_model_lens()[pools.main_pool]
        threshold = pools.long_threshold_tokens or main_len
        if payload is None or (threshold is not None and bound.total_tokens <= min(threshold, main_len or threshold)):
            return bound
        for replica in [r for r in router.order(None) if r.healthy][:2]:
            exact = await exact_need(client, replica.url, payload, bound, min(5.0, limits.request_timeout_s))
            if exact is not None:
                return exact
        return bound

    async def health(_: Request) -> Response:
        ok = any(r.healthy for r in router.replicas)
        return JSONResponse({"healthy_replicas": sum(r.healthy for r in router.replicas)},
                            status_code=200 if ok else 503)

    async def status(_: Request) -> Response:
        lens = router.max_model_lens()
        return IndentedJSON({"replicas": [vars(r) for r in router.replicas],
                             "pools": {name: {"urls": list(urls), "max_model_len": lens[name], "routed": routed[name],
                                              "long": name == pools.long_pool} for name, urls in pools.pools},
                             **({"long_threshold_tokens": pools.long_threshold_tokens or lens[pools.main_pool]}
                                if pools.long_pool else {}),
                             **({"canary": canary.status()} if canary else {})})

    async def canary_status(_: Request) -> Response:
        if canary is None:
            return JSONResponse({"error": "no canary: start tally route with --canary"}, status_code=404)
        return IndentedJSON(canary.status())

    async def internal_error(_: Request, exc: Exception) -> Response:
        # Starlette logs the traceback after this answer; the client gets no exception text.
        return error_response(TallyError("the router failed on this request; its log has the details"))

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        tasks = [asyncio.create_task(health_loop())]
        if canary is not None:
            tasks += [asyncio.create_task(canary_loop(canary))] + [
                asyncio.create_task(scrape_loop(canary, url)) for url in canary.backends.urls]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await client.aclose()
            if canary is not None:
                canary.close()

    return Starlette(routes=[
        Route("/health", health), Route("/metrics", metrics), Route("/router/status", status),
        Route("/router/canary", canary_status),
        Route("/v1/{rest:path}", proxy, methods=["GET", "POST"]),
        # A Tally or vLLM server's tokenizer, so `tally bench --url` the proxy counts prompt tokens exactly.
        Route("/tokenize", proxy, methods=["POST"]), Route("/detokenize", proxy, methods=["POST"]),
    ], lifespan=lifespan, exception_handlers={Exception: internal_error})
