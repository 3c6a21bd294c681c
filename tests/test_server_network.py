"""Safe to expose: slow and idle connections cannot pile up, a page in a browser cannot drive the server, and
nothing answers a cross-origin read. A real `tally serve` on 127.0.0.1; raw sockets play the attackers. Timeouts
in the test are bounds for "the server never closed it", never measurements."""
from __future__ import annotations

import socket
import time

import httpx
import pytest
from support.servers import started

from tally.server.process import ServerProcess

MAX_CONNECTIONS = 8
NEVER_S = 60.0


def _server(ckpt, *flags: str) -> ServerProcess:
    return ServerProcess(["--model", str(ckpt), "--served-model-name", "tiny", "--dtype", "float32",
                          "--max-model-len", "256", "--kv-cache-memory", "8MB", "--log-level", "warning", *flags])


@pytest.fixture(scope="module")
def servers(tiny_llama):
    """A 1 s header deadline; and few connections with a header deadline far beyond the test, so only the cap can
    close them. Started side by side."""
    with started(_server(tiny_llama, "--header-timeout", "1"),
                 _server(tiny_llama, "--max-connections", str(MAX_CONNECTIONS), "--header-timeout", "600")) as pair:
        yield pair


@pytest.fixture(scope="module")
def server(servers):
    return servers[0]


@pytest.fixture(scope="module")
def capped(servers):
    return servers[1]


def _closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closes this connection (reads until it does, or NEVER_S passes)."""
    sock.settimeout(NEVER_S)
    try:
        while sock.recv(4096):
            pass
    except (TimeoutError, socket.timeout):
        return False
    except ConnectionResetError:
        pass
    return True


def test_a_client_that_never_finishes_its_headers_is_closed(server):
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-")  # ... and nothing more
        assert _closed_by_server(sock)
    assert httpx.get(server.url + "/health").status_code == 200


def _still_open(sock: socket.socket) -> bool:
    sock.settimeout(0.5)
    try:
        return sock.recv(1) != b""
    except (TimeoutError, socket.timeout):
        return True
    except ConnectionResetError:
        return False


def test_connections_over_the_cap_are_closed_and_the_server_recovers(capped):
    server = capped
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(3 * MAX_CONNECTIONS)]
    try:
        assert all(_closed_by_server(s) for s in idle[MAX_CONNECTIONS:])  # every connection past the cap
        assert all(_still_open(s) for s in idle[:MAX_CONNECTIONS])
    finally:
        for s in idle:
            s.close()
    deadline = time.monotonic() + NEVER_S
    while True:  # the server lets go of the closed sockets at its own pace
        try:
            if httpx.get(server.url + "/health", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the server did not serve again after the idle connections left"
        time.sleep(0.1)


def test_a_foreign_host_header_is_refused(server):
    """DNS rebinding: a page at evil.example re-points its name at 127.0.0.1; its requests carry that Host."""
    r = httpx.post(server.url + "/v1/completions", headers={"host": "evil.example"},
                   json={"model": "tiny", "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 400
    assert httpx.get(server.url + "/v1/models", headers={"host": "localhost"}).status_code == 200


def test_no_cross_origin_reads_and_no_form_posts(server):
    origin = {"origin": "https://evil.example"}
    preflight = httpx.options(server.url + "/v1/completions",
                              headers={**origin, "access-control-request-method": "POST"})
    assert "access-control-allow-origin" not in preflight.headers
    models = httpx.get(server.url + "/v1/models", headers=origin)
    assert "access-control-allow-origin" not in models.headers
    form = httpx.post(server.url + "/v1/completions", headers=origin, data={"prompt": "hi"})
    assert form.status_code == 415
