"""`tally route` holds its own limits: a real router process in front of a small stdlib replica on loopback that
misbehaves on request (trickles, stalls, breaks a stream off, answers 503), with raw sockets as the hostile
clients. Every refusal is a 4xx or 5xx in OpenAI's error shape that names the limit, a stream the router ends
closes with an error event and [DONE], and no traceback reaches a client. Timeouts in the test are bounds for
"the router never answered", never measurements."""
from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import openai
import pytest

from tally.ports import free_port
from tally.server.process import ServerProcess

NEVER_S = 20.0
MiB = 2**20
LIMIT_BYTES = 4 * MiB  # above the million-deep body, so its depth is what refuses it
BUSY = {"error": {"message": "the waiting queue is full", "type": "rate_limit_error", "param": None, "code": 503}}


def _event(text: str) -> bytes:
    chunk = {"id": "c", "object": "text_completion", "created": 0, "model": "m",
             "choices": [{"index": 0, "text": text, "finish_reason": None, "logprobs": None}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


class Replica(BaseHTTPRequestHandler):
    """Answers /v1/completions by its prompt: busy (503 + Retry-After + a JSON body), cut (two events, half a
    third, then the connection closed), trickle (an event, then a byte at a time), stall (no answer)."""
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        self._answer(200, b"ok", "text/plain")

    def do_POST(self) -> None:
        prompt = json.loads(self.rfile.read(int(self.headers["content-length"])))["prompt"]
        if prompt == "busy":
            self._answer(503, json.dumps(BUSY).encode(), "application/json", {"Retry-After": "7"})
        elif prompt == "stall":
            self.server.stop.wait(NEVER_S)
        else:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                getattr(self, "_" + prompt)()
            except OSError:  # the router let go
                pass
            self.close_connection = True

    def _cut(self) -> None:
        for piece in (_event("a"), _event("b"), _event("c")[:20]):
            self._chunk(piece)
        self.connection.shutdown(socket.SHUT_RDWR)

    def _trickle(self) -> None:
        self._chunk(_event("a"))
        while not self.server.stop.wait(0.2):  # every read comes long before any per-read timeout would fire
            self._chunk(b"d")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _answer(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in {"Content-Type": content_type, "Content-Length": str(len(body)), **(headers or {})}.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)


@contextlib.contextmanager
def _replica() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Replica)
    server.daemon_threads, server.stop = True, threading.Event()  # stop: ends what its handlers wait for
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.stop.set()
        server.shutdown()
        server.server_close()


def _router(*flags: str) -> ServerProcess:
    return ServerProcess([], command=lambda port: [sys.executable, "-m", "tally.cli", "route", *flags,
                                                   "--health-interval", "0.3", "--port", str(port)])


@pytest.fixture(scope="module")
def replica():
    with _replica() as url:
        yield url


@pytest.fixture(scope="module")
def router(replica):
    with _router("--replica", replica, "--header-timeout", "1", "--body-timeout", "1", "--request-timeout", "2",
                 "--max-body-bytes", str(LIMIT_BYTES)) as r:
        yield r


def _error(r: httpx.Response) -> dict:
    assert r.headers["content-type"].startswith("application/json"), r.text
    return r.json()["error"]


def _answer_while_sending(port: int, head: bytes, piece: bytes, interval_s: float) -> tuple[int, dict, int]:
    """Sends `head`, then `piece` every `interval_s` until the router answers (64 MiB at most); the answer's status,
    its JSON error and the bytes sent."""
    sent, answer, done = [0], b"", threading.Event()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(NEVER_S)
        sock.sendall(head)

        def send() -> None:
            try:
                while not done.is_set() and sent[0] < 64 * MiB:
                    sock.sendall(piece)
                    sent[0] += len(piece)
                    time.sleep(interval_s)
            except OSError:  # the router closed the connection after answering
                pass

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        try:
            while b"\r\n\r\n" not in answer or len(answer.partition(b"\r\n\r\n")[2]) < _length(answer):
                got = sock.recv(65536)
                if not got:
                    break
                answer += got
        finally:
            done.set()
            sender.join(NEVER_S)
    head_text, _, body = answer.partition(b"\r\n\r\n")
    return int(head_text.split()[1]), json.loads(body)["error"], sent[0]


def _length(answer: bytes) -> int:
    for line in answer.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 1 << 30


def _closed_by_router(sock: socket.socket) -> bool:
    try:
        return sock.recv(4096) == b""
    except ConnectionResetError:
        return True


@pytest.mark.parametrize("after_an_answer", [False, True])
def test_a_client_that_never_finishes_its_headers_is_closed(router, after_an_answer):
    with socket.create_connection(("127.0.0.1", router.port)) as sock:
        sock.settimeout(NEVER_S)
        if after_an_answer:  # a kept-alive connection: uvicorn's keep-alive timer restarts with every byte
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            answer = b""
            while not answer.endswith(b"}"):
                answer += sock.recv(4096)
            assert answer.startswith(b"HTTP/1.1 200")
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-")  # ... and nothing more
        assert _closed_by_router(sock)


def test_a_body_that_never_ends_is_answered_408(router):
    head = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    status, error, _ = _answer_while_sending(router.port, head, b"1\r\n \r\n", 0.05)
    assert status == 408 and "did not arrive within 1 s" in error["message"], error


def test_an_oversized_body_is_refused_413_before_it_is_read_whole(router):
    head = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    piece = b"%x\r\n%s\r\n" % (MiB, b" " * MiB)
    status, error, sent = _answer_while_sending(router.port, head, piece, 0.0)
    assert status == 413 and f"limit of {LIMIT_BYTES:,} bytes" in error["message"], error
    assert sent < 64 * MiB  # the router stopped reading at its limit and closed the connection
    declared = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n" % (1 << 40)
    status, error, _ = _answer_while_sending(router.port, declared, b"", 1.0)  # refused on its declared length
    assert status == 413 and "--max-body-bytes" in error["message"], error


def test_a_body_nested_a_million_deep_gets_400(router):
    body = '{"prompt": ' + "[" * 10**6 + "]" * 10**6 + "}"
    r = httpx.post(router.base_url + "/completions", content=body, timeout=NEVER_S)
    assert r.status_code == 400 and "nests 1000001 levels deep; at most 64" in _error(r)["message"]


def test_a_replica_503_is_passed_on_with_its_body_and_retry_after(router):
    r = httpx.post(router.base_url + "/completions", json={"model": "m", "prompt": "busy"}, timeout=NEVER_S)
    assert (r.status_code, r.headers["retry-after"], r.json()) == (503, "7", BUSY)


def test_a_stream_its_replica_breaks_off_ends_with_an_error_event_and_done(router):
    with httpx.stream("POST", router.base_url + "/completions", json={"model": "m", "prompt": "cut", "stream": True},
                      timeout=NEVER_S) as r:
        raw = b"".join(r.iter_raw())
    assert raw.startswith(_event("a") + _event("b") + b"data: {")  # whole events, then the router's
    *_, error, done = [line for line in raw.decode().split("\n\n") if line]
    assert done == "data: [DONE]"
    assert json.loads(error.removeprefix("data: "))["error"]["code"] == 502
    client = openai.OpenAI(base_url=router.base_url, api_key="x", max_retries=0)
    texts = []
    with pytest.raises(openai.APIError, match="broke off the stream"):
        for chunk in client.completions.create(model="m", prompt="cut", stream=True):
            texts.append(chunk.choices[0].text)
    assert texts == ["a", "b"]


def test_a_trickling_replica_is_cut_at_the_request_deadline(router):
    with httpx.stream("POST", router.base_url + "/completions", timeout=NEVER_S,
                      json={"model": "m", "prompt": "trickle", "stream": True}) as r:
        events = [line for line in r.iter_lines() if line]
    assert events[0] == _event("a").decode().strip()
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert (error["code"], events[-1]) == (504, "data: [DONE]") and "--request-timeout 2 s" in error["message"]
    r = httpx.post(router.base_url + "/completions", json={"model": "m", "prompt": "stall"}, timeout=NEVER_S)
    assert r.status_code == 504 and "no replica answered within --request-timeout 2 s" in _error(r)["message"]


def test_the_router_logs_where_it_listens_and_no_traceback(router, replica):
    log = router.log()
    assert f"tally route on http://127.0.0.1:{router.port} in front of {replica}" in log
    assert "limits: a body of at most 4.00 MiB (4,194,304 B) within 1 s, headers within 1 s" in log
    assert "Traceback" not in log
    status = httpx.get(router.url + "/router/status")
    assert status.text.startswith('{\n  "replicas": [')  # indented for a person


def test_the_canary_logs_its_settings_and_each_decision(replica, tmp_path):
    (tmp_path / "rules.yaml").write_text("min_samples: 5\nwindow: 1s\nrules: [{metric: error_rate, max_increase: 0}]\n")
    with _replica() as canary, _router("--replica", replica, "--canary", canary, "--plan", "50%:1h,100%", "--rules",
                                       str(tmp_path / "rules.yaml"), "--eval-interval", "0.2s") as router:
        deadline = time.monotonic() + NEVER_S
        while "canary hold at step 1 of 2: weight now 50%; error_rate: 0 canary" not in router.log():
            assert time.monotonic() < deadline, router.log()
            time.sleep(0.1)
        assert (f"canary start: {canary} at 50% of new requests; plan 50% for 3600 s, 100%; rules error_rate "
                f"max_increase 0 over 1 s windows of at least 5 samples, judged every 0.2 s") in router.log()
        assert httpx.get(router.url + "/router/canary").text.startswith('{\n  "phase": "running",')
