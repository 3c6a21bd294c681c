"""A server whose engine loop dies says so: /health turns 503, the request in flight gets a clear error instead of
hanging, new requests get 503 with Retry-After; with --restart-on-failure it loads a fresh engine and serves again.

The server runs in this process (the real app under uvicorn on 127.0.0.1) so the test can kill its engine thread
the way a crash would: an exception raised inside that thread, mid-run."""
from __future__ import annotations

import ctypes
import threading
import time

import httpx
import pytest
import uvicorn
from support.ledger_polling import expect_ledger
from support.tiny_models import make_checkpoint

from tally.engine.config import EngineConfig
from tally.engine.engine import Engine
from tally.server.app import ServerConfig, build_app
from tally.server.process import free_port

CONTEXT = 65536
NEVER_S = 120.0


class InProcessServer:
    def __init__(self, ckpt, restart_on_failure: bool) -> None:
        engine = Engine(EngineConfig(model=str(ckpt), served_model_name="tiny", dtype="float32",
                                     max_model_len=CONTEXT, kv_cache_memory=48 * 2**20))
        self.app = build_app(engine, ServerConfig(restart_on_failure=restart_on_failure))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    @property
    def engine_loop(self):
        return self.app.state.tally.engine

    def __enter__(self) -> InProcessServer:
        self._thread.start()
        deadline = time.monotonic() + NEVER_S
        while not self._server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(NEVER_S)

    def kill_engine_thread(self) -> None:
        ident = self.engine_loop._thread.ident
        assert ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(SystemExit)) == 1


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("tiny-64k"), "llama", max_position_embeddings=CONTEXT)


def _long_stream(server: InProcessServer, events: list[str]) -> None:
    body = {"model": "tiny", "prompt": "once", "max_tokens": CONTEXT - 64, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=NEVER_S) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line)


def _kill_mid_run(server: InProcessServer) -> tuple[list[str], threading.Thread]:
    events: list[str] = []
    client = threading.Thread(target=_long_stream, args=(server, events))
    client.start()
    expect_ledger(server, lambda led: led["requests"]["running"] == 1 and led["kv"]["blocks_used"] >= 4,
                  "the request generating")
    server.kill_engine_thread()
    return events, client


def test_a_dead_engine_loop_fails_the_request_in_flight_and_turns_health_503(ckpt):
    with InProcessServer(ckpt, restart_on_failure=False) as server:
        events, client = _kill_mid_run(server)
        client.join(NEVER_S)
        assert not client.is_alive(), "the stream in flight hung after its engine died"
        assert "engine loop stopped" in events[-2] and events[-1] == "data: [DONE]", events[-2:]
        assert httpx.get(server.url + "/health").status_code == 503
        r = httpx.post(server.url + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1, r.text


def test_restart_on_failure_brings_the_server_back(ckpt):
    with InProcessServer(ckpt, restart_on_failure=True) as server:
        events, client = _kill_mid_run(server)
        client.join(NEVER_S)
        assert not client.is_alive() and "engine loop stopped" in events[-2]
        deadline = time.monotonic() + NEVER_S
        while server.engine_loop.restarts == 0 or httpx.get(server.url + "/health").status_code != 200:
            assert time.monotonic() < deadline, "the engine never came back"
            time.sleep(0.05)
        r = httpx.post(server.url + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 4},
                       timeout=NEVER_S)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text
        led = httpx.get(server.url + "/ledger").json()
        assert led["kv"]["blocks_used"] == 0
