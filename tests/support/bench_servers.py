"""Small real OpenAI-compatible streaming servers for the `tally bench` tests.

Plain asyncio HTTP/1.1 (keep-alive, chunked SSE) so that the server is never the bottleneck when
the client's ceiling is measured. One process per server (`serve(...)` starts it as a subprocess on
a free port), so the client under test does not share a GIL with it.

Modes, applied to every `fault_every`-th completion request (1 = all of them):
  ok     stream fake tokens (one word each) with `token_delay_s` between them
  503    answer 503 Service Unavailable
  drop   stream two tokens, then drop the connection mid-stream
  hang   read the request and never answer
  leak   like ok, but the reported process memory and KV usage grow with every request
Also serves /v1/models, /tokenize, /detokenize (a word-level tokenizer with a BOS token) and
/metrics (Prometheus text with `tally:` names).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

_TOKEN_RE = re.compile(r"\s*[A-Za-z]+|\s*[0-9]|\s*[^\sA-Za-z0-9]|\s+")
BOS_ID = 1


@dataclass
class FakeTokenizer:
    """Word-level: each token is one word or symbol with its leading whitespace."""

    vocab: dict[str, int] = field(default_factory=dict)
    pieces: list[str] = field(default_factory=lambda: ["<unk>", "<s>"])

    def encode(self, text: str) -> list[int]:
        ids = [BOS_ID]
        for piece in _TOKEN_RE.findall(text):
            if piece not in self.vocab:
                self.vocab[piece] = len(self.pieces)
                self.pieces.append(piece)
            ids.append(self.vocab[piece])
        return ids

    def decode(self, ids: list[int]) -> str:
        return "".join(self.pieces[i] for i in ids if i > BOS_ID and i < len(self.pieces))


@dataclass
class ServerState:
    mode: str
    fault_every: int
    token_delay_s: float
    model: str = "fake-model"
    tokenizer: FakeTokenizer = field(default_factory=FakeTokenizer)
    num_completions: int = 0
    num_running: int = 0
    rss_bytes: int = 200_000_000


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _response(status: str, body: bytes, content_type: str = "application/json") -> bytes:
    head = (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


def _sse(obj: dict) -> bytes:
    return _chunk(b"data: " + json.dumps(obj).encode() + b"\n\n")


def _metrics(state: ServerState) -> bytes:
    leak = state.mode == "leak"
    kv = min(0.95, 0.2 + (0.01 * state.num_completions if leak else 0.0))
    lines = [
        "# TYPE tally:kv_cache_usage_perc gauge", f"tally:kv_cache_usage_perc {kv}",
        "# TYPE tally:kv_cache_fragmentation_perc gauge", "tally:kv_cache_fragmentation_perc 0.05",
        "# TYPE tally:num_requests_running gauge", f"tally:num_requests_running {state.num_running}",
        "# TYPE tally:num_requests_waiting gauge", "tally:num_requests_waiting 0",
        "# TYPE process_resident_memory_bytes gauge",
        f"process_resident_memory_bytes {state.rss_bytes}",
        "# TYPE tally:request_queue_time_seconds histogram",
    ]
    n = state.num_completions
    for le, count in (("0.001", 0), ("0.01", n), ("0.1", n), ("+Inf", n)):
        lines.append(f'tally:request_queue_time_seconds_bucket{{le="{le}"}} {count}')
    lines += [f"tally:request_queue_time_seconds_sum {0.005 * n}",
              f"tally:request_queue_time_seconds_count {n}"]
    return ("\n".join(lines) + "\n").encode()


async def _stream_completion(state: ServerState, body: dict, writer: asyncio.StreamWriter,
                             faulty: bool) -> bool:
    """Streams the answer; returns False when the connection must be dropped."""
    chat = "messages" in body
    prompt = body.get("prompt") or " ".join(m["content"] for m in body.get("messages", []))
    prompt_tokens = len(state.tokenizer.encode(prompt))
    max_tokens = int(body.get("max_tokens") or 16)
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n")
    for i in range(max_tokens):
        if state.token_delay_s > 0:
            await writer.drain()
            await asyncio.sleep(state.token_delay_s)
        if faulty and state.mode == "drop" and i == 2:
            await writer.drain()
            return False
        text = f" w{i}"
        choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
        writer.write(_sse({"id": "x", "object": "chunk", "choices": [choice]}))
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens,
             "total_tokens": prompt_tokens + max_tokens}
    if (body.get("stream_options") or {}).get("include_usage"):
        writer.write(_sse({"id": "x", "object": "chunk", "choices": [], "usage": usage}))
    writer.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    await writer.drain()
    return True


async def _completion(state: ServerState, body: dict, writer: asyncio.StreamWriter) -> bool:
    state.num_completions += 1
    faulty = state.mode != "ok" and state.num_completions % state.fault_every == 0
    if state.mode == "leak":
        state.rss_bytes += 1_000_000
    if faulty and state.mode == "503":
        writer.write(_response("503 Service Unavailable", b'{"error": {"message": "overloaded"}}'))
        return True
    if faulty and state.mode == "hang":
        await asyncio.sleep(3600)
    if not body.get("stream"):
        n = int(body.get("max_tokens") or 16)
        out = {"choices": [{"index": 0, "text": " w" * n}],
               "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}}
        writer.write(_response("200 OK", json.dumps(out).encode()))
        return True
    state.num_running += 1
    try:
        return await _stream_completion(state, body, writer, faulty)
    finally:
        state.num_running -= 1


async def _handle(state: ServerState, reader: asyncio.StreamReader,
                  writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            request_line, *header_lines = head.decode("latin-1").split("\r\n")
            method, path, _ = request_line.split(" ", 2)
            headers = {k.lower(): v.strip() for k, _, v in
                       (line.partition(":") for line in header_lines if line)}
            raw = await reader.readexactly(int(headers.get("content-length", "0")))
            body = json.loads(raw) if raw else {}
            keep_open = True
            if path in ("/v1/completions", "/v1/chat/completions") and method == "POST":
                keep_open = await _completion(state, body, writer)
            elif path == "/tokenize":
                ids = state.tokenizer.encode(body.get("prompt", ""))
                out = {"tokens": ids, "count": len(ids), "max_model_len": 1_000_000}
                writer.write(_response("200 OK", json.dumps(out).encode()))
            elif path == "/detokenize":
                text = state.tokenizer.decode(body.get("tokens", []))
                writer.write(_response("200 OK", json.dumps({"prompt": text}).encode()))
            elif path == "/v1/models":
                out = {"object": "list", "data": [{"id": state.model, "object": "model",
                                                    "max_model_len": 1_000_000}]}
                writer.write(_response("200 OK", json.dumps(out).encode()))
            elif path == "/metrics":
                writer.write(_response("200 OK", _metrics(state), "text/plain; version=0.0.4"))
            else:
                writer.write(_response("404 Not Found", b'{"error": {"message": "no route"}}'))
            if not keep_open:
                writer.transport.abort()
                return
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def _main(args: argparse.Namespace) -> None:
    state = ServerState(args.mode, args.fault_every, args.token_delay_ms / 1000)
    server = await asyncio.start_server(lambda r, w: _handle(state, r, w), "127.0.0.1", args.port,
                                        backlog=1024)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


@dataclass(frozen=True)
class RunningServer:
    url: str
    pid: int


@contextlib.contextmanager
def serve(mode: str = "ok", fault_every: int = 1,
          token_delay_ms: float = 0.0) -> Iterator[RunningServer]:
    """Runs a fake server in a subprocess on a free port."""
    cmd = [sys.executable, str(Path(__file__)), "--mode", mode, "--fault-every", str(fault_every),
           "--token-delay-ms", str(token_delay_ms)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # the server's first and only line; "" if it died
        if not line.startswith("PORT "):
            raise RuntimeError(f"fake server did not start (exit code {proc.poll()})")
        yield RunningServer(f"http://127.0.0.1:{int(line.split()[1])}", proc.pid)
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", default="ok", choices=["ok", "503", "drop", "hang", "leak"])
    parser.add_argument("--fault-every", type=int, default=1)
    parser.add_argument("--token-delay-ms", type=float, default=0.0)
    parser.add_argument("--port", type=int, default=0)
    asyncio.run(_main(parser.parse_args()))
