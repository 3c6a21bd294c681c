"""`tally route` in front of two real `tally serve` replicas: answers and streams pass through unchanged, load
spreads, a shared system prompt sticks to one replica, a killed replica is taken out and nothing fails. One pair of
replicas serves the file (starting one costs more than all of a test's requests): the last test kills them."""
from __future__ import annotations

import sys
import time

import httpx
import openai
import pytest
from support.servers import started

from tally.server.process import ServerProcess

FLAGS = ["--served-model-name", "tiny", "--dtype", "float32", "--max-model-len", "256", "--kv-cache-memory", "8MB",
         "--log-level", "warning"]


def _router(*urls: str) -> ServerProcess:
    replicas = [arg for url in urls for arg in ("--replica", url)]
    return ServerProcess([], command=lambda port: [sys.executable, "-m", "tally.cli", "route", *replicas, "--port",
                                                   str(port), "--health-interval", "0.3"])


def _served(router: ServerProcess) -> dict[str, int]:
    return {r["url"]: r["served"] for r in httpx.get(router.url + "/router/status").json()["replicas"]}


@pytest.fixture(scope="module")
def replicas(tiny_llama):
    with started(ServerProcess([str(tiny_llama), *FLAGS]), ServerProcess([str(tiny_llama), *FLAGS])) as pair:
        yield pair


def test_answers_and_streams_pass_through_and_load_spreads(replicas):
    a, b = replicas
    with _router(a.url, b.url) as router:
        direct = openai.OpenAI(base_url=a.base_url, api_key="x", max_retries=0)
        routed = openai.OpenAI(base_url=router.base_url, api_key="x", max_retries=0)
        for i in range(8):
            kw = dict(model="tiny", prompt=f"count {i}:", max_tokens=6, temperature=0)
            expected = direct.completions.create(**kw).choices[0].text
            assert routed.completions.create(**kw).choices[0].text == expected
            assert "".join(c.choices[0].text for c in routed.completions.create(**kw, stream=True)) == expected
        assert routed.models.list().data[0].id == "tiny"
        served = _served(router)
        assert min(served.values()) > 0, served  # both replicas took requests

        before = _served(router)
        system = {"role": "system", "content": "You are a terse assistant who answers in one word."}
        for i in range(6):
            routed.chat.completions.create(model="tiny", max_tokens=2,
                                           messages=[system, {"role": "user", "content": f"q{i}"}])
        gained = [served - before[url] for url, served in _served(router).items()]
        assert sorted(gained) == [0, 6], gained  # one replica holds the shared prefix


def test_a_killed_replica_is_taken_out_and_no_request_fails(replicas):
    """The file's last test: it kills the module's replicas."""
    a, b = replicas
    with _router(a.url, b.url) as router:
        routed = openai.OpenAI(base_url=router.base_url, api_key="x", max_retries=0)
        a.proc.kill()
        a.proc.wait()
        for i in range(10):  # the first ones may still pick the dead replica: they fail over before any byte
            assert routed.completions.create(model="tiny", prompt=f"x{i}", max_tokens=3).choices[0].text is not None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            status = {r["url"]: r["healthy"] for r in httpx.get(router.url + "/router/status").json()["replicas"]}
            if status == {a.url: False, b.url: True}:
                break
            time.sleep(0.2)
        assert status == {a.url: False, b.url: True}
        b.proc.kill()
        b.proc.wait()
        r = httpx.post(router.base_url + "/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2})
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert "tally_route_requests_total" in httpx.get(router.url + "/metrics").text
