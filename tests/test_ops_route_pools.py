"""`tally route` with length pools in front of two real `tally serve` replicas of different --max-model-len (and
a pool URL nothing listens on): a trace with a long tail lands pool by pool by prompt + max_tokens, nothing a pool
could serve is refused, and a request no pool can hold gets a 400 that says why."""
from __future__ import annotations

import sys
import time

import httpx
import openai
import pytest
from support.servers import started

from tally.ports import free_port
from tally.server.process import ServerProcess

FLAGS = ["--served-model-name", "tiny", "--dtype", "float32", "--kv-cache-memory", "8MB", "--log-level", "warning"]
MAIN_LEN, LONG_LEN = 96, 256  # the tiny model's context is 256


def _router(*args: str) -> ServerProcess:
    return ServerProcess([], command=lambda port: [sys.executable, "-m", "tally.cli", "route", *args, "--port",
                                                   str(port), "--health-interval", "0.3"])


def _status(router: ServerProcess) -> dict:
    return httpx.get(router.url + "/router/status").json()


def _ready(router: ServerProcess) -> dict:
    """The status once both pools' max_model_len are known (read from the replicas' /v1/models)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        status = _status(router)
        if all(p["max_model_len"] for p in status["pools"].values()):
            return status
        time.sleep(0.1)
    raise AssertionError(status)


@pytest.fixture(scope="module")
def pools(tiny_llama):
    with started(ServerProcess([str(tiny_llama), *FLAGS, "--max-model-len", str(MAIN_LEN)]),
                 ServerProcess([str(tiny_llama), *FLAGS, "--max-model-len", str(LONG_LEN)])) as pair:
        yield pair


def _prompt_of(server: ServerProcess, tokens: int) -> tuple[str, int]:
    """A prompt of about `tokens` tokens, and its exact count."""
    text = " ".join(f"w{i % 7}" for i in range(tokens))
    while True:
        count = httpx.post(server.url + "/tokenize", json={"prompt": text}).json()["count"]
        if count <= tokens:
            return text, count
        text = text[: len(text) * tokens // count - 1]


def test_a_long_tail_lands_pool_by_pool_and_only_the_impossible_is_refused(pools):
    short, long = pools
    down = f"http://127.0.0.1:{free_port()}"  # a main-pool replica that is down, as a dead replica is handled
    threshold = 64
    trace = [(_prompt_of(short, n), m) for n, m in
             [(20, 8), (40, 8), (10, 4), (30, 16), (50, 8), (15, 8), (55, 8), (61, 2), (62, 4), (100, 8), (180, 16),
              (70, None), (230, 16)]]
    with _router("--pool", f"main={short.url},{down}", "--pool", f"long={long.url}", "--long-pool", "long",
                 "--long-threshold", str(threshold)) as router:
        status = _ready(router)
        assert status["pools"]["main"]["max_model_len"] == MAIN_LEN
        assert status["pools"]["long"]["max_model_len"] == LONG_LEN and status["long_threshold_tokens"] == threshold
        client = openai.OpenAI(base_url=router.base_url, api_key="x", max_retries=0)
        expected = {"main": 0, "long": 0}
        for (prompt, count), max_tokens in trace:
            kw = {"max_tokens": max_tokens} if max_tokens is not None else {}
            answer = client.completions.create(model="tiny", prompt=prompt, temperature=0, **kw)
            assert answer.usage.prompt_tokens == count
            expected["long" if count + (max_tokens or 1) > threshold else "main"] += 1
        status = _status(router)
        assert {name: p["routed"] for name, p in status["pools"].items()} == expected
        served = {r["url"]: r["served"] for r in status["replicas"]}
        assert served[short.url] == expected["main"] and served[long.url] == expected["long"]
        assert {r["url"]: r["healthy"] for r in status["replicas"]}[down] is False

        # chat counts through the replica's template
        chat = client.chat.completions.create(model="tiny", max_tokens=100, messages=[
            {"role": "user", "content": "hello"}])
        assert chat.choices[0].message is not None and _status(router)["pools"]["long"]["routed"] == \
            expected["long"] + 1

        too_long, count = _prompt_of(short, 240)
        r = httpx.post(router.base_url + "/completions", json={"model": "tiny", "prompt": too_long,
                                                               "max_tokens": 64})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "max_tokens" and f"{count + 64:,} tokens" in error["message"]
        assert "max_model_len is 256" in error["message"]
        metrics = httpx.get(router.url + "/metrics").text
        assert 'tally_route_pool_requests_total{pool="long"}' in metrics
        assert "tally_route_pool_refused_total 1.0" in metrics


def test_a_threshold_above_the_main_pools_length_still_never_overfills_it(pools):
    """The threshold (here the default: the main pool's own max_model_len, and then a larger one by hand) decides
    between pools that can both hold a request; one the main pool cannot hold goes long regardless."""
    short, long = pools
    (prompt, count) = _prompt_of(short, 120)
    for threshold in ([], ["--long-threshold", "10000"]):
        with _router("--pool", f"main={short.url}", "--pool", f"long={long.url}", "--long-pool", "long",
                     *threshold) as router:
            _ready(router)
            client = openai.OpenAI(base_url=router.base_url, api_key="x", max_retries=0)
            client.completions.create(model="tiny", prompt=prompt, max_tokens=4)
            client.completions.create(model="tiny", prompt="short", max_tokens=4)
            assert {name: p["routed"] for name, p in _status(router)["pools"].items()} == {"main": 1, "long": 1}
