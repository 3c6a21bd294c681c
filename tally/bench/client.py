"""One streamed completion request and its timing record. Failures become a cause string on the
record (`http_503`, `timeout`, `disconnect`, ...) and never a latency sample."""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

from tally.bench.prompts import Prompt
from tally.bench.wire import ConnectionPool, StreamClosedError

PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclass
class RequestRecord:
    """Times are seconds since the run started (one monotonic clock)."""

    id: int
    phase: str
    scheduled_s: float  # when the schedule said to send it
    prompt_tokens: int  # the server's usage.prompt_tokens; the planned count until it reports
    expected_prompt_tokens: int  # what the prompt was cut to by the tokenizer
    expected_output_tokens: int  # max_tokens sent
    warmup: bool = False
    sent_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    end_s: float | None = None  # response finished or failed
    itl_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    status: int | None = None  # HTTP status
    error: str | None = None  # None, or the cause: http_503, timeout, disconnect, ...
    detail: str | None = None  # the server's error message or the exception, for a person

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.sent_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.last_token_s is None else self.last_token_s - self.sent_s

    @property
    def tpot_s(self) -> float | None:
        if self.first_token_s is None or self.output_tokens < 2:
            return None
        return (self.last_token_s - self.first_token_s) / (self.output_tokens - 1)

    @property
    def lateness_s(self) -> float | None:
        return None if self.sent_s is None else self.sent_s - self.scheduled_s


@dataclass(frozen=True)
class ClientConfig:
    model: str
    endpoint: str = "completions"  # or "chat"
    timeout_s: float = 300.0  # whole request, first byte to last
    ignore_eos: bool = True  # force the output length; off when the server rejects the field
    extra_body: tuple[tuple[str, object], ...] = ()


def request_body(config: ClientConfig, prompt: Prompt, max_tokens: int) -> bytes:
    body: dict[str, object] = {"model": config.model, "max_tokens": int(max_tokens),
                               "stream": True, "stream_options": {"include_usage": True}}
    if config.endpoint == "chat":
        system = [{"role": "system", "content": prompt.system_text}] if prompt.system_text else []
        body["messages"] = system + [{"role": "user", "content": prompt.user_text}]
    else:
        body["prompt"] = prompt.text
    if config.ignore_eos:
        body["ignore_eos"] = True
    body.update(config.extra_body)
    return json.dumps(body).encode()


def _event_text(event: dict) -> str:
    text = ""
    for choice in event.get("choices") or ():
        delta = choice.get("delta")
        text += (delta.get("content") or "") if delta else (choice.get("text") or "")
    return text


def _finish_reason(event: dict) -> str | None:
    return next((c["finish_reason"] for c in event.get("choices") or () if c.get("finish_reason")), None)


async def _stream(pool: ConnectionPool, path: str, body: bytes, record: RequestRecord,
                  t0: float) -> None:
    record.sent_s = time.perf_counter() - t0
    async with pool.post(path, body) as response:
        record.status = response.status
        if response.status != 200:
            record.error = f"http_{response.status}"
            record.detail = (await response.read(500)).decode("utf-8", "replace")
            return
        done, pending, usage_tokens = False, b"", None
        finish_reason, ended_s = None, None  # how and when the server said the output was complete
        async for data in response.iter_body():
            now = time.perf_counter() - t0
            lines = (pending + data).split(b"\n")
            pending = lines.pop()
            for line in lines:
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    done = True
                    continue
                event = json.loads(payload)
                if "error" in event:
                    record.error, record.detail = "stream_error", str(event["error"])[:500]
                    return
                if _event_text(event):
                    if record.first_token_s is None:
                        record.first_token_s = now
                    else:
                        record.itl_s.append(now - record.last_token_s)
                    record.last_token_s = now
                    record.output_tokens += 1
                usage = event.get("usage")
                if usage:
                    usage_tokens = usage.get("completion_tokens")
                    record.prompt_tokens = usage.get("prompt_tokens") or record.prompt_tokens
                finish_reason = finish_reason or _finish_reason(event)
                if ended_s is None and (finish_reason or usage):
                    ended_s = now
        if not done:
            record.error = "incomplete_stream"
            return
        generated = usage_tokens if usage_tokens is not None else finish_reason == "length"
        if record.first_token_s is None and generated and ended_s is not None:
            # Tokens without text (a special token such as an ignored EOS is skipped in the text) reach the
            # client only in the chunk that finishes the choice, with finish_reason and an empty text: a
            # complete answer that is empty, not a failure. Seen when that chunk (or the usage) arrives.
            record.first_token_s = record.last_token_s = ended_s
            record.output_tokens = int(usage_tokens or record.expected_output_tokens)
        if record.first_token_s is None:
            record.error = "no_output"
        elif usage_tokens:
            record.output_tokens = int(usage_tokens)  # one event may carry several tokens


async def send(pool: ConnectionPool, config: ClientConfig, record: RequestRecord, prompt: Prompt,
               t0: float) -> RequestRecord:
    """Sends one request now and fills `record`; never raises for a server-side failure."""
    path, body = PATHS[config.endpoint], request_body(config, prompt, record.expected_output_tokens)
    try:
        async with asyncio.timeout(config.timeout_s):
            await _stream(pool, path, body, record, t0)
    except TimeoutError:
        record.error, record.detail = "timeout", f"no complete answer within {config.timeout_s:g}s"
    except (StreamClosedError, ConnectionResetError, BrokenPipeError) as exc:
        record.error, record.detail = "disconnect", str(exc) or type(exc).__name__
    except ConnectionRefusedError as exc:
        record.error, record.detail = "connect_refused", str(exc)
    except OSError as exc:
        record.error, record.detail = "connect_error", str(exc)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        record.error, record.detail = "bad_stream", str(exc)
    record.end_s = time.perf_counter() - t0
    return record
