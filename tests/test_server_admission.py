"""Admission control, timeouts and SIGTERM drain of `tally serve`, each proven to give KV blocks back.

None of these tests may depend on how fast the CPU is. A request that must still be running when the test
acts fills a 64k-token context of a tiny model: tens of thousands of decode steps, each a forward pass plus the
engine's Python bookkeeping, so minutes on a slow CPU and still tens of seconds on the fastest (an AVX-512 BF16
machine runs this model at under a thousand steps a second). The test waits until the server's /ledger reports
the request running, then acts; it ends the request itself (client disconnect, --request-timeout, SIGTERM), and
checks through engine_steps that the request did not run to its end instead."""
from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.ledger_polling import (
    NEVER_S,
    await_ledger,
    expect_ledger,
    idle,
    kv_tokens,
    ledger,
)
from support.servers import started
from support.tiny_models import make_checkpoint

from tally.server.process import ServerProcess

BASE = ["--dtype", "float32", "--served-model-name", "tiny"]
LONG_LEN = 65536  # the tiny model's context, so a request filling it cannot end before the test ends it
KV_BYTES_PER_TOKEN = 512  # /ledger's kv.bytes_per_token for it: 2 layers x 2 KV heads x 16 dims x (K, V) x fp32
LONG = {"model": "tiny", "prompt": "The quick brown fox", "max_tokens": LONG_LEN - 64, "ignore_eos": True}
SHORT = {"model": "tiny", "prompt": "Paris is", "max_tokens": 4, "ignore_eos": True}


@pytest.fixture(scope="module")
def long_context_tiny(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("tiny-64k"), "llama", max_position_embeddings=LONG_LEN)


def long_server(checkpoint, *flags: str, long_requests: int = 1) -> ServerProcess:
    """A server whose KV pool holds `long_requests` full-context requests at once (and a little more), so no
    running request is ever preempted back into the queue, however far it gets while the test works."""
    pool_mib = long_requests * LONG_LEN * KV_BYTES_PER_TOKEN // 2**20 + 4
    return ServerProcess(["--model", str(checkpoint), *BASE, "--max-model-len", str(LONG_LEN),
                          "--kv-cache-memory", f"{pool_mib}MiB", *flags])


def check_pool_holds(server: ServerProcess, long_requests: int) -> None:
    led = ledger(server)
    assert kv_tokens(led) >= long_requests * LONG_LEN, \
        f"the pool no longer holds {long_requests} full contexts (KV_BYTES_PER_TOKEN is stale?): {led['kv']}"


# Each server's flags, and how many full-context requests its pool holds at once.
SERVERS = {"queue": (("--max-num-seqs", "2", "--max-queue", "2"), 2),
           # A request of LONG["max_tokens"] decode steps outlasts the 2 s timeout on any CPU by an order of magnitude.
           "timeout": (("--request-timeout", "2"), 1),
           "drain": (("--max-num-seqs", "1", "--drain-timeout", str(NEVER_S)), 1),
           "cut": (("--drain-timeout", "2"), 1)}


@pytest.fixture(scope="module")
def servers(long_context_tiny) -> dict[str, ServerProcess]:
    """The file's servers, started side by side; each test uses one, and the SIGTERM tests end theirs."""
    with started(*(long_server(long_context_tiny, *flags, long_requests=n) for flags, n in SERVERS.values())) as s:
        for server, (_, n) in zip(s, SERVERS.values()):
            check_pool_holds(server, n)
        yield dict(zip(SERVERS, s))


@pytest.fixture(scope="module")
def queue_server(servers):
    return servers["queue"]


@pytest.fixture(scope="module")
def timeout_server(servers):
    return servers["timeout"]


def metric(server, name: str, **labels: str) -> float:
    text = httpx.get(server.url + "/metrics").text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name and labels.items() <= s.labels.items())


def steps(server) -> int:
    return ledger(server)["engine_steps"]


async def hold_stream(client: httpx.AsyncClient, body: dict) -> None:
    """Reads a stream to its end (leaving early would cancel it)."""
    async with client.stream("POST", "/completions", json=body) as r:
        async for _ in r.aiter_lines():
            pass


def data_events(lines) -> list[str]:
    """The payloads of a stream's `data: ` events."""
    return [line[6:] for line in lines if line.startswith("data: ")]


def past_first_event(response: httpx.Response) -> Iterator[str]:
    """The stream's lines after its first event (the request's first token), unread. Keep the iterator while
    the request should run: dropping it closes the connection, which aborts the request."""
    lines = response.iter_lines()
    while not next(lines).startswith("data: "):
        pass
    return lines


def test_full_queue_answers_429_with_retry_after_and_admitted_requests_finish(queue_server):
    steps_before = steps(queue_server)

    async def scenario():
        async with httpx.AsyncClient(base_url=queue_server.base_url, timeout=300) as c:
            # Both batch slots taken by full-context streams, which run until their clients leave.
            running = [asyncio.ensure_future(hold_stream(c, {**LONG, "stream": True})) for _ in range(2)]
            await await_ledger(queue_server, lambda x: x["requests"]["running"] == 2, "both long requests running")
            waiting = [asyncio.ensure_future(c.post("/completions", json=SHORT)) for _ in range(2)]
            await await_ledger(queue_server, lambda x: x["requests"]["queued"] == 2, "two requests queued")
            rejected = await c.post("/completions", json=SHORT)
            # Nothing could have moved meanwhile: the long requests end only when their clients leave.
            during = (await c.get(queue_server.url + "/ledger")).json()["requests"]
            for task in running:  # the long streams' clients leave; the queue moves
                task.cancel()
            return rejected, during, await asyncio.gather(*waiting)

    rejected, during, admitted = asyncio.run(scenario())
    assert during["running"] == 2 and during["queued"] == 2
    assert rejected.status_code == 429 and int(rejected.headers["retry-after"]) >= 1
    assert rejected.json()["error"]["type"] == "rate_limit_error"
    assert [r.status_code for r in admitted] == [200, 200]
    assert all(r.json()["usage"]["completion_tokens"] == SHORT["max_tokens"] for r in admitted)
    led = expect_ledger(queue_server, idle, "an idle pool once the admitted requests finished")
    assert led["engine_steps"] - steps_before < LONG["max_tokens"]  # the long requests were aborted, not finished
    assert metric(queue_server, "tally:request_rejected_total", reason="queue_full") == 1
    assert metric(queue_server, "tally:request_success_total", finished_reason="abort") == 2
    assert metric(queue_server, "tally:request_success_total", finished_reason="length") == 2


def test_request_timeout_is_504_or_an_error_event_and_frees_blocks(timeout_server):
    steps_before = steps(timeout_server)
    client = openai.OpenAI(base_url=timeout_server.base_url, api_key="unused", max_retries=0, timeout=NEVER_S)
    with pytest.raises(openai.APIStatusError) as e:
        client.completions.create(model="tiny", prompt=LONG["prompt"], max_tokens=LONG["max_tokens"],
                                  extra_body={"ignore_eos": True})
    assert e.value.status_code == 504 and "request-timeout" in e.value.response.json()["error"]["message"]
    expect_ledger(timeout_server, idle, "the timed-out request's blocks freed")
    with httpx.stream("POST", timeout_server.base_url + "/completions", json={**LONG, "stream": True},
                      timeout=NEVER_S) as r:
        assert r.status_code == 200  # headers went out before the timeout: it arrives as an event
        events = data_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == 504
    led = expect_ledger(timeout_server, idle, "the timed-out stream's blocks freed")
    # Two requests of LONG["max_tokens"] steps each ended long before that: the timeout aborted them.
    assert led["engine_steps"] - steps_before < LONG["max_tokens"]
    assert metric(timeout_server, "tally:request_timeout_total") == 2
    assert metric(timeout_server, "tally:request_success_total") == 0


def turned_away(server: ServerProcess) -> list[httpx.Response | httpx.TransportError]:
    """After SIGTERM: sends requests for a model the server does not serve (404, no engine work, while it still
    admits requests), each on a new connection, until one is refused at connect: the listening socket is closed.
    Returns what came back from the first answer that was not a 404 on (503s while draining, then the refusal)."""
    body = {"model": "not-served", "prompt": "hi", "max_tokens": 1}
    seen: list[httpx.Response | httpx.TransportError] = []
    deadline = time.monotonic() + NEVER_S
    with httpx.Client(base_url=server.base_url, timeout=30, limits=httpx.Limits(max_keepalive_connections=0)) as c:
        while time.monotonic() < deadline:
            try:
                r = c.post("/completions", json=body)
            except httpx.ConnectError as exc:
                return [*seen, exc]
            except httpx.TransportError as exc:  # accepted just before the socket closed, then closed unanswered
                seen.append(exc)
                continue
            if r.status_code != 404 or seen:
                seen.append(r)
    raise AssertionError(f"the server kept admitting requests after SIGTERM: {seen}\n{server.log()}")


def assert_turned_away(answers: list[httpx.Response | httpx.TransportError]) -> None:
    assert isinstance(answers[-1], httpx.ConnectError)
    for a in answers[:-1]:
        if isinstance(a, httpx.Response):  # a request that reached the app while draining
            assert a.status_code == 503 and a.json()["error"]["type"] == "service_unavailable", a.text
            assert int(a.headers["retry-after"]) >= 1


def test_sigterm_drains_admitted_requests_then_exits_cleanly(servers):
    """A request admitted before SIGTERM is served to its end while new requests are turned away; the server
    exits 0 as soon as nothing is left. Here that request waits for the one batch slot, held by a full-context
    stream, until that stream's client leaves after SIGTERM: it is certainly unfinished when SIGTERM arrives, and
    finishing it takes a handful of steps after that, however fast or slow the CPU. --drain-timeout is only an
    upper bound here."""
    short = {**SHORT, "max_tokens": 16, "stream": True, "stream_options": {"include_usage": True}}

    def read_stream(body: dict) -> tuple[int, list[str]]:
        with httpx.stream("POST", server.base_url + "/completions", json=body, timeout=NEVER_S) as r:
            return r.status_code, data_events(r.iter_lines())

    server = servers["drain"]
    with ThreadPoolExecutor(1) as pool:
        with httpx.stream("POST", server.base_url + "/completions", json={**LONG, "stream": True},
                          timeout=NEVER_S) as held:
            unread = past_first_event(held)  # noqa: F841 - held open until the `with` ends
            expect_ledger(server, lambda x: x["requests"]["running"] == 1, "the long request running")
            admitted = pool.submit(read_stream, short)
            expect_ledger(server, lambda x: x["requests"] == {"running": 1, "waiting": 1, "queued": 1},
                          "the short request queued behind the long one")
            server.proc.send_signal(signal.SIGTERM)
            answers = turned_away(server)
        # Leaving the `with` closed the long stream: its request is aborted and the batch slot goes to the
        # request that was admitted before SIGTERM.
        status, events = admitted.result(timeout=NEVER_S)
        assert server.proc.wait(NEVER_S) == 0, server.log()
    assert_turned_away(answers)
    assert status == 200 and events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == short["max_tokens"]


def test_sigterm_cancels_what_outlasts_the_drain_timeout_then_exits_cleanly(servers):
    """A full-context stream cannot finish within a 2 s --drain-timeout on any CPU: the server cuts it (no
    finish_reason, no [DONE]) when the drain timeout runs out, and still exits 0."""
    server = servers["cut"]
    rest: list[str] = []
    with httpx.stream("POST", server.base_url + "/completions", json={**LONG, "stream": True},
                      timeout=NEVER_S) as r:
        lines = past_first_event(r)
        expect_ledger(server, lambda x: x["requests"]["running"] == 1, "the long request running")
        server.proc.send_signal(signal.SIGTERM)
        try:
            for line in lines:
                rest.append(line)
        except (httpx.RemoteProtocolError, httpx.ReadError):  # the connection closed mid-body: the cut
            pass
    assert server.proc.wait(NEVER_S) == 0, server.log()
    events = data_events(rest)
    assert "[DONE]" not in events
    assert all(c["choices"][0]["finish_reason"] is None for c in map(json.loads, events) if c.get("choices"))
