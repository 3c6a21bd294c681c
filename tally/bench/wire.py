"""A minimal asyncio HTTP/1.1 client for the measured requests: keep-alive pool, chunked or
length-delimited bodies, bytes handed over as they arrive so token times are taken at arrival.

Why not httpx here: on this 2-core machine httpx spends 5-20 ms of CPU per streamed request
(connection-pool bookkeeping that grows with concurrency), capping the client near 150 req/s;
this client spends ~0.2 ms, so the load generator is not what is measured. It also carries the
many small /tokenize calls of prompt preparation; httpx does the few other auxiliary calls
(metrics, model list, probe), where its generality matters more than speed."""
from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from tally.errors import ConfigError

Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class StreamClosedError(ConnectionError):
    """The server closed the connection before the response was complete."""


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    _reader: asyncio.StreamReader
    complete: bool = False  # body read to its end; the connection may be reused

    async def iter_body(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive (chunked, Content-Length, or until close)."""
        reader = self._reader
        try:
            if "chunked" in self.headers.get("transfer-encoding", ""):
                while True:
                    size = int((await reader.readline()).split(b";")[0].strip() or b"x", 16)
                    if size == 0:
                        await reader.readuntil(b"\r\n")  # no trailers are sent by LLM servers
                        break
                    data = await reader.readexactly(size + 2)
                    yield data[:-2]
            elif "content-length" in self.headers:
                remaining = int(self.headers["content-length"])
                while remaining > 0:
                    data = await reader.read(min(remaining, 65536))
                    if not data:
                        raise StreamClosedError("connection closed mid-body")
                    remaining -= len(data)
                    yield data
            else:
                while data := await reader.read(65536):
                    yield data
        except (asyncio.IncompleteReadError, ValueError) as exc:
            raise StreamClosedError(f"connection closed mid-body ({exc})") from None
        self.complete = "close" not in self.headers.get("connection", "")

    async def read(self, limit_bytes: int = 65536) -> bytes:
        body = b""
        async for data in self.iter_body():
            body += data[: max(limit_bytes - len(body), 0)]
        return body


@dataclass
class ConnectionPool:
    base_url: str
    headers: dict[str, str] = field(default_factory=dict)
    _idle: list[Connection] = field(default_factory=list)

    def __post_init__(self) -> None:
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"--url {self.base_url!r} must look like http://HOST:PORT")
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self._host = parts.hostname
        self._port = parts.port or (443 if self._ssl else 80)
        self._prefix = parts.path.rstrip("/")
        extra = "".join(f"{k}: {v}\r\n" for k, v in self.headers.items())
        self._head = f"Host: {parts.netloc}\r\nContent-Type: application/json\r\n{extra}".encode()

    async def _send(self, conn: Connection, path: str, body: bytes) -> Response:
        reader, writer = conn
        writer.write(b"POST %s HTTP/1.1\r\n%sContent-Length: %d\r\n\r\n%s" % (
            (self._prefix + path).encode(), self._head, len(body), body))
        head = await reader.readuntil(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in
                   (line.partition(":") for line in lines if line)}
        if status_line.startswith("HTTP/1.0") and "keep-alive" not in headers.get("connection", ""):
            headers["connection"] = "close"
        return Response(int(status_line.split(" ", 2)[1]), headers, reader)

    @asynccontextmanager
    async def post(self, path: str, body: bytes) -> AsyncIterator[Response]:
        """POST and hand back the response head; the body is read by the caller. The connection
        goes back to the pool only when the body was read to its end."""
        response = None
        while response is None:
            reused = bool(self._idle)
            conn = self._idle.pop() if reused else await asyncio.open_connection(
                self._host, self._port, ssl=self._ssl, limit=1 << 20)
            try:
                response = await self._send(conn, path, body)
            except (asyncio.IncompleteReadError, ConnectionError):
                conn[1].close()
                if not reused:  # a reused idle connection may have been closed by the server
                    raise StreamClosedError("connection closed before the response head") from None
            except BaseException:
                conn[1].close()
                raise
        try:
            yield response
        finally:
            if response.complete:
                self._idle.append(conn)
            else:
                conn[1].close()

    async def post_json(self, path: str, payload: object) -> tuple[int, object]:
        """A small JSON call (e.g. /tokenize): status and decoded body (None if not JSON)."""
        async with self.post(path, json.dumps(payload).encode()) as response:
            body = await response.read(1 << 26)
        try:
            return response.status, json.loads(body)
        except ValueError:
            return response.status, None

    def close(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()
