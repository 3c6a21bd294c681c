"""Admission control, timeouts and SIGTERM drain of `tally serve`, each proven to give KV blocks back."""
from __future__ import annotations

import asyncio
import json
import signal

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.tiny_models import make_checkpoint

from tally.server.process import ServerProcess

BASE = ["--dtype", "float32", "--served-model-name", "tiny"]
LONG = {"model": "tiny", "prompt": "The quick brown fox", "max_tokens": 1800, "ignore_eos": True}


@pytest.fixture(scope="module")
def long_context_tiny(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("tiny-2k"), "llama", max_position_embeddings=2048)


@pytest.fixture(scope="module")
def queue_server(long_context_tiny):
    args = ["--model", str(long_context_tiny), *BASE, "--kv-cache-memory", "16MB",
            "--max-num-seqs", "2", "--max-queue", "2"]
    with ServerProcess(args) as s:
        yield s


@pytest.fixture(scope="module")
def timeout_server(tmp_path_factory):
    # Wide enough that 1,800 decode steps take several times the 2 s timeout even on an idle machine.
    slow = make_checkpoint(tmp_path_factory.mktemp("tiny-slow"), "llama", max_position_embeddings=2048,
                           hidden_size=512, intermediate_size=1536, num_hidden_layers=6, num_attention_heads=8,
                           num_key_value_heads=4)
    with ServerProcess(["--model", str(slow), *BASE, "--kv-cache-memory", "64MB", "--request-timeout", "2"]) as s:
        yield s


def pool(server) -> dict:
    return httpx.get(server.url + "/ledger").json()


def metric(server, name: str, **labels: str) -> float:
    text = httpx.get(server.url + "/metrics").text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name and labels.items() <= s.labels.items())


async def wait_until(server, predicate, timeout_s: float = 60.0) -> dict:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        led = pool(server)
        if predicate(led) or asyncio.get_running_loop().time() > deadline:
            return led
        await asyncio.sleep(0.05)


async def hold_stream(client: httpx.AsyncClient, body: dict, started: asyncio.Event) -> None:
    """Reads a stream to its end (leaving early would cancel it), flagging its first event."""
    async with client.stream("POST", "/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                started.set()


def test_full_queue_answers_429_with_retry_after_and_admitted_requests_finish(queue_server):
    async def scenario():
        async with httpx.AsyncClient(base_url=queue_server.base_url, timeout=300) as c:
            running = []
            for _ in range(2):  # both batch slots taken by long streams
                started = asyncio.Event()
                running.append(asyncio.ensure_future(hold_stream(c, {**LONG, "stream": True}, started)))
                await started.wait()
            short = {"model": "tiny", "prompt": "Paris is", "max_tokens": 4, "ignore_eos": True}
            waiting = [asyncio.ensure_future(c.post("/completions", json=short)) for _ in range(2)]
            led = await wait_until(queue_server, lambda x: x["requests"]["queued"] == 2)
            assert led["requests"]["running"] == 2
            rejected = await c.post("/completions", json=short)
            for task in running:  # the long streams' clients leave; the queue moves
                task.cancel()
            return rejected, await asyncio.gather(*waiting)

    rejected, admitted = asyncio.run(scenario())
    assert rejected.status_code == 429 and int(rejected.headers["retry-after"]) >= 1
    assert rejected.json()["error"]["type"] == "rate_limit_error"
    assert [r.status_code for r in admitted] == [200, 200]
    assert all(r.json()["usage"]["completion_tokens"] == 4 for r in admitted)
    led = asyncio.run(wait_until(queue_server, lambda x: x["kv"]["blocks_used"] == 0))
    assert led["kv"]["blocks_used"] == 0 and led["requests"]["queued"] == 0
    assert metric(queue_server, "tally:request_rejected_total", reason="queue_full") == 1


def test_request_timeout_is_504_or_an_error_event_and_frees_blocks(timeout_server):
    client = openai.OpenAI(base_url=timeout_server.base_url, api_key="unused", max_retries=0, timeout=120)
    with pytest.raises(openai.APIStatusError) as e:
        client.completions.create(model="tiny", prompt=LONG["prompt"], max_tokens=LONG["max_tokens"],
                                  extra_body={"ignore_eos": True})
    assert e.value.status_code == 504 and "request-timeout" in e.value.response.json()["error"]["message"]
    events = []
    with httpx.stream("POST", timeout_server.base_url + "/completions", json={**LONG, "stream": True},
                      timeout=120) as r:
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][6:])["error"]["code"] == 504
    led = asyncio.run(wait_until(timeout_server, lambda x: x["kv"]["blocks_used"] == 0))
    assert led["kv"]["blocks_used"] == 0 and led["requests"]["running"] == 0
    assert metric(timeout_server, "tally:request_timeout_total") == 2


def test_sigterm_drains_running_requests_then_exits_cleanly(tiny_llama):
    server = ServerProcess(["--model", str(tiny_llama), *BASE, "--kv-cache-memory", "8MB"]).start()
    body = {"model": "tiny", "prompt": "Numbers:", "max_tokens": 120, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.base_url + "/completions", json=body, timeout=120) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        server.proc.send_signal(signal.SIGTERM)
        rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    assert json.loads(rest[-2][6:])["choices"][0]["finish_reason"] == "length"
    with pytest.raises(httpx.HTTPError):  # the listening socket is closed while draining
        httpx.post(server.base_url + "/completions", json={**body, "stream": False}, timeout=5).raise_for_status()
    assert server.proc.wait(60) == 0
