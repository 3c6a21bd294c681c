"""The load generator's reading of a streamed answer, byte for byte: each test serves a fixed SSE body
(as a real server sent it) from a local socket and checks the record `tally bench` makes of it.

Pins a false `no_output` against `tally serve`: a request whose only token had no text
(the tiny model sampled `<|im_end|>`, an EOS ignored with ignore_eos and skipped in the text) is sent as
one chunk with an empty text and finish_reason, then the usage. Tokens were generated, so the request
is a success with an empty answer, never a failure."""
from __future__ import annotations

import asyncio
import json

import pytest

from tally.bench.client import ClientConfig, RequestRecord, send
from tally.bench.prompts import Prompt
from tally.bench.wire import ConnectionPool

# Exactly what `tally serve` streamed for that request (max_tokens 1, ignore_eos, include_usage).
SPECIAL_TOKEN_ONLY = (
    b'data: {"id":"cmpl-fc722e417d46446d93da950ca133bb24","object":"text_completion","created":1796040603,'
    b'"model":"tiny","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length"}]}\n\n'
    b'data: {"id":"cmpl-fc722e417d46446d93da950ca133bb24","object":"text_completion","created":1796040603,'
    b'"model":"tiny","choices":[],"usage":{"prompt_tokens":8,"completion_tokens":1,"total_tokens":9,'
    b'"prompt_tokens_details":{"cached_tokens":0}}}\n\n'
    b'data: [DONE]\n\n'
)


def _sse(*events: dict | str) -> bytes:
    return b"".join(b"data: " + (e.encode() if isinstance(e, str) else json.dumps(e).encode()) + b"\n\n"
                    for e in events)


def _text(text: str, finish: str | None = None) -> dict:
    return {"object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": finish}]}


def _chat(delta: dict, finish: str | None = None) -> dict:
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _usage(completion_tokens: int, prompt_tokens: int = 8) -> dict:
    return {"choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                     "total_tokens": prompt_tokens + completion_tokens}}


async def _serve_once(body: bytes, piece_bytes: int) -> tuple[asyncio.Server, int]:
    """A local server answering every POST with `body`, HTTP-chunked in pieces of `piece_bytes`."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(0, len(body), piece_bytes):
            piece = body[i:i + piece_bytes]
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def _record_of(body: bytes, endpoint: str = "completions", max_tokens: int = 1,
               piece_bytes: int = 1 << 20) -> RequestRecord:
    async def main() -> RequestRecord:
        server, port = await _serve_once(body, piece_bytes)
        pool = ConnectionPool(f"http://127.0.0.1:{port}")
        record = RequestRecord(0, "test", 0.0, prompt_tokens=5, expected_prompt_tokens=5,
                               expected_output_tokens=max_tokens)
        try:
            return await send(pool, ClientConfig("tiny", endpoint, timeout_s=60.0), record,
                              Prompt("hi", None, "hi", 5), 0.0)
        finally:
            pool.close()
            server.close()
            await server.wait_closed()

    return asyncio.run(main())


def _assert_ok(record: RequestRecord, output_tokens: int) -> None:
    assert record.error is None, (record.error, record.detail)
    assert record.output_tokens == output_tokens
    assert record.sent_s <= record.first_token_s <= record.last_token_s <= record.end_s


@pytest.mark.parametrize("piece_bytes", [1 << 20, 7, 1])
def test_a_token_without_text_is_an_empty_answer_not_no_output(piece_bytes):
    record = _record_of(SPECIAL_TOKEN_ONLY, piece_bytes=piece_bytes)
    _assert_ok(record, 1)
    assert record.prompt_tokens == 8 and record.first_token_s == record.last_token_s and record.itl_s == []
    assert record.tpot_s is None


def test_chat_tokens_without_text_count_with_the_usage():
    body = _sse(_chat({"role": "assistant", "content": ""}), _chat({}, "length"), _usage(3), "[DONE]")
    record = _record_of(body, "chat", max_tokens=3)
    _assert_ok(record, 3)


def test_without_usage_a_length_finish_means_max_tokens_were_generated():
    record = _record_of(_sse(_text("", "length"), "[DONE]"), max_tokens=4)
    _assert_ok(record, 4)


def test_text_in_the_finishing_chunk_is_output():
    record = _record_of(_sse(_text(" a"), _text(" b", "length"), _usage(2), "[DONE]"), max_tokens=2)
    _assert_ok(record, 2)
    assert record.first_token_s <= record.last_token_s and len(record.itl_s) == 1


def test_text_after_tokens_without_text_keeps_the_usage_count():
    body = _sse(_text(" a", "length"), _usage(3), "[DONE]")  # two silent tokens came before " a"
    _assert_ok(_record_of(body, max_tokens=3), 3)


@pytest.mark.parametrize("events", [
    (_text("", "stop"), _usage(0)),  # the server says nothing was generated
    (_text("", "stop"),),  # no usage, and a stop finish need not follow any token
    (_usage(0),),
])
def test_no_token_at_all_is_still_no_output(events):
    record = _record_of(_sse(*events, "[DONE]"))
    assert record.error == "no_output" and record.first_token_s is None


def test_a_stream_without_done_is_incomplete_even_with_output():
    record = _record_of(_sse(_text(" a", "length"), _usage(1)))
    assert record.error == "incomplete_stream"
