"""Hostile and mistaken requests against a real `tally serve`: each fails alone with a 4xx that names what to fix,
the server's memory stays bounded, nothing is logged as an internal error, and the server keeps serving."""
from __future__ import annotations

import json

import httpx
import pytest

from tally.json_text import MAX_JSON_DEPTH
from tally.sampling_params import MAX_STOP_CHARS
from tally.server.process import ServerProcess

MODEL = "tiny"
MiB = 2**20


@pytest.fixture(scope="module")
def server(tiny_llama):
    with ServerProcess(["--model", str(tiny_llama), "--served-model-name", MODEL, "--dtype", "float32",
                        "--max-model-len", "256", "--kv-cache-memory", "8MB", "--log-level", "warning"]) as s:
        yield s


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def _post(server: ServerProcess, path: str, body: dict | str | bytes, **headers: str) -> httpx.Response:
    if isinstance(body, dict):
        body = json.dumps(body)
    return httpx.post(server.url + path, content=body, timeout=60.0,
                      headers={"content-type": "application/json", **headers})


def _completion(**fields) -> dict:
    return {"model": MODEL, "prompt": "hello", "max_tokens": 4, **fields}


def _chat(messages: list, **fields) -> dict:
    return {"model": MODEL, "messages": messages, "max_tokens": 4, **fields}


ATTACKS = {
    # name: (path, body, status, the field or phrase the error must name)
    "one 1 MiB stop string": ("/v1/completions", _completion(stop="x" * MiB), 400, "stop"),
    "stop strings past the total": ("/v1/completions", _completion(stop=["y" * 300] * 16), 400, "stop"),
    "many stop strings": ("/v1/completions", _completion(stop=[f"s{i}" for i in range(100)]), 400, "stop"),
    "n of 1000": ("/v1/completions", _completion(n=1000), 400, "n"),
    "seed of 2**70": ("/v1/completions", _completion(seed=2**70), 400, "seed"),
    "a lone surrogate in a prompt": ("/v1/completions", '{"model": "tiny", "prompt": "a\\ud800b"}', 400,
                                     "surrogate"),
    "a lone surrogate in a chat": ("/v1/chat/completions",
                                   '{"model": "tiny", "messages": [{"role": "user", "content": "\\udc00"}]}',
                                   400, "surrogate"),
    "a lone surrogate to /tokenize": ("/tokenize", '{"prompt": "\\ud800"}', 400, "surrogate"),
    "a request's own chat template, untrusted": ("/v1/chat/completions",
                                                 _chat([{"role": "user", "content": "hi"}],
                                                       chat_template="{% set x = [0] * 50000000 %}{{ x|length }}"),
                                                 400, "--trust-request-chat-template"),
    "temperature Infinity": ("/v1/completions", '{"model": "tiny", "prompt": "a", "temperature": Infinity}', 400,
                             "temperature"),
    "an unknown chat role": ("/v1/chat/completions", _chat([{"role": "wizard", "content": "hi"}]), 400, "role"),
    "a user message without content": ("/v1/chat/completions", _chat([{"role": "user", "content": None}]), 400,
                                       "content"),
    "top_logprobs past the cap": ("/v1/chat/completions",
                                  _chat([{"role": "user", "content": "hi"}], logprobs=True, top_logprobs=50),
                                  400, "top_logprobs"),
    "a body nested 100,000 deep": ("/v1/completions", '{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}", 400,
                                   "nests"),
    "a text/plain body (a browser form)": ("/v1/completions", _completion(), 415, "content-type"),
}


@pytest.mark.parametrize("name", list(ATTACKS))
def test_each_hostile_request_fails_alone_with_a_4xx_naming_the_fix(server, name):
    path, body, status, names = ATTACKS[name]
    headers = {"content-type": "text/plain"} if "text/plain" in name else {}
    r = _post(server, path, body, **headers)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert names in (error["message"] + " " + str(error["param"])), error


def test_attacks_leave_memory_bounded_no_tracebacks_and_the_server_serving(server):
    before = _rss_bytes(server.proc.pid)
    for _ in range(3):
        for path, body, _, _ in ATTACKS.values():
            _post(server, path, body)
    growth = _rss_bytes(server.proc.pid) - before
    assert growth < 200 * MiB, f"RSS grew {growth / MiB:.0f} MiB"  # a 1 MiB stop string's prefixes, kept in a set, would exhaust the memory
    assert "Traceback" not in server.log()
    assert httpx.get(server.url + "/health").status_code == 200
    ok = _post(server, "/v1/completions", _completion(stop=["z" * (MAX_STOP_CHARS // 2)], seed=2**64 - 1, n=2))
    assert ok.status_code == 200, ok.text


def test_the_depth_limit_admits_ordinary_nesting(server):
    nested: dict = {"type": "object"}
    for _ in range(MAX_JSON_DEPTH // 2 - 2):
        nested = {"properties": {"x": nested}}
    r = _post(server, "/v1/chat/completions", _chat([{"role": "user", "content": "hi"}], metadata=nested))
    assert r.status_code == 200, r.text
