"""The life of one generation request, shared by every generation endpoint (completions, chat, messages,
responses): read and validate → submit → wait (racing client disconnect, --request-timeout and a cancel) →
respond, and count exactly one outcome in the metrics. The endpoint modules only translate formats."""
from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncIterator, Protocol

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from tally.engine.async_engine import AsyncEngine, RequestStream
from tally.errors import InvalidRequestError, ModelNotFoundError, RequestTimeoutError, clip, echo
from tally.http_limits import read_body
from tally.json_text import check_depth
from tally.lora_request import LoRARequest
from tally.models.generation_config import max_tokens_or_default
from tally.outputs import RequestOutput
from tally.sampling_params import SamplingParams
from tally.server.errors import (
    ServerDrainingError,
    UnsupportedMediaTypeError,
    as_tally_error,
    error_response,
    rejection_reason,
)
from tally.server.metrics import ServerMetrics, StreamTimes
from tally.server.request_log import RequestLog
from tally.server.streaming import OPENAI, EventStreamResponse, Framing

if TYPE_CHECKING:
    from tally.models.tokenizer import Tokenizer

log = logging.getLogger("tally.server")
PARSE_IN_THREAD_BYTES = 1 << 20  # a larger body is parsed on a thread (read_json)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


@dataclass
class ServerState:
    engine: AsyncEngine
    metrics: ServerMetrics
    tokenizer: Tokenizer  # the server's own copy: the engine thread decodes with the engine's
    model_name: str  # the reported name, first of model_names
    max_model_len: int
    request_timeout_s: float | None = None
    max_body_bytes: int = 16 * 2**20
    model_names: tuple[str, ...] = ()  # every name the API answers to
    sampling_defaults: dict[str, float] = field(default_factory=dict)  # generation_config.json's, for unset fields
    draining: bool = False
    request_log: RequestLog | None = None
    inflight: dict[str, Inflight] = field(default_factory=dict)  # by the id its response carries, for a cancel
    supported_tasks: tuple[str, ...] = ("generate",)  # the engine's: a generative model, or an embedding one
    loras: dict[str, LoRARequest] = field(default_factory=dict)  # LoRA adapters served, by the name requests use

    def check_task(self, task: str, path: str) -> None:
        """400 for an endpoint of the task this server does not serve (vLLM's: one runner per server)."""
        if task not in self.supported_tasks:
            served = {"embed": "embeddings (--runner pooling)", "score": "scores (a cross-encoder)",
                      "generate": "text generation"}[self.supported_tasks[0]]
            wanted = "--runner pooling (an embedding model)" if task == "embed" else "--runner generate"
            raise InvalidRequestError(f"{path} is not served here: this server serves {served} for "
                                      f"{self.model_name!r}; start one with {wanted} for it", param="model")

    def check_model(self, model: str | None) -> LoRARequest | None:
        """The LoRA adapter `model` names, None for the base model; 404 for a name not served (vLLM's words)."""
        if model is None or model in (self.model_names or (self.model_name,)):
            return None
        lora = self.loras.get(model)
        if lora is None:
            adapters = f" and adapters {sorted(self.loras)}" if self.loras else ""
            raise ModelNotFoundError(f"The model `{clip(model)}` does not exist. This server serves "
                                     f"{self.model_name!r}{adapters} (see GET /v1/models)", param="model")
        return lora


@dataclass
class Ctx:
    """One HTTP request in flight, as the endpoint formatters see it."""

    request_id: str
    created_s: int
    model: str
    req: Any
    request_ids: list[str]  # engine request ids, one per prompt, in prompt order
    sent: dict[tuple[int, int], tuple[int, int, bool]] = field(default_factory=dict)  # see streaming.deltas
    times: dict[str, StreamTimes] = field(default_factory=dict)
    arrival_unix_s: float = 0.0
    max_tokens: list[int | None] = field(default_factory=list)  # per prompt; None: up to max_model_len
    prompts: list[Any] = field(default_factory=list)  # the engine prompts, in prompt order
    cancelled: bool = False  # a cancel ended it (POST /v1/responses/{id}/cancel); outputs are partial
    handler_state: dict[str, Any] = field(default_factory=dict)  # the handler's own bookkeeping of a stream
    reasoning: dict[tuple[int, int], Any] = field(default_factory=dict)  # chat's thinking streams (chat.py:_split)


class Handler(Protocol):
    """One API's formats. A stream is `opening`'s events, then `events` each time outputs move, then `closing`'s;
    `framing` writes them and the API's errors."""

    path: str
    id_prefix: str
    framing: Framing

    def parse(self, body: dict) -> Any: ...  # the request, with at least `model` and `stream`
    def engine_requests(self, req: Any, state: ServerState) -> list[tuple[Any, SamplingParams]]: ...
    def response(self, ctx: Ctx, outputs: list[RequestOutput], state: ServerState) -> dict: ...
    def opening(self, ctx: Ctx) -> list[dict]: ...
    def events(self, ctx: Ctx, outputs: list[RequestOutput | None]) -> list[dict]: ...
    def closing(self, ctx: Ctx, outputs: list[RequestOutput | None]) -> list[dict]: ...


class OpenAIStream:
    """The stream of OpenAI's completions and chat: `chunks`, with usage in each (vLLM's continuous_usage_stats)
    and after the last (include_usage)."""

    framing = OPENAI
    chunk_object: str

    def chunks(self, ctx: Ctx, outputs: list[RequestOutput | None]) -> list[dict]:
        raise NotImplementedError

    def opening(self, ctx: Ctx) -> list[dict]:
        return []

    def events(self, ctx: Ctx, outputs: list[RequestOutput | None]) -> list[dict]:
        chunks = self.chunks(ctx, outputs)
        if chunks and ctx.req.continuous_usage:
            so_far = usage([o for o in outputs if o is not None])
            chunks = [{**c, "usage": so_far} for c in chunks]
        return chunks

    def closing(self, ctx: Ctx, outputs: list[RequestOutput | None]) -> list[dict]:
        if not ctx.req.include_usage:
            return []
        return [{"id": ctx.request_id, "object": self.chunk_object, "created": ctx.created_s, "model": ctx.model,
                 "choices": [], "usage": usage([o for o in outputs if o is not None])}]


class ClientDisconnected(Exception):
    pass


class Cancelled(Exception):
    """A cancel request ended the generation; what it had made is the answer."""


class Inflight:
    """One request's wait on the engine. A client disconnect or the deadline fails its stream, so
    whoever awaits the stream wakes with ClientDisconnected or RequestTimeoutError; no polling."""

    def __init__(self, state: ServerState, request: Request, stream: RequestStream, arrival_s: float) -> None:
        self.state, self.stream = state, stream
        self.latest: dict[str, RequestOutput] = {}  # the outputs last read
        self.closed = asyncio.Event()  # set once its answer is written or its stream closed
        self._disconnect = asyncio.ensure_future(self._watch(request))
        self._deadline: asyncio.TimerHandle | None = None
        if state.request_timeout_s:
            left_s = max(0.0, arrival_s + state.request_timeout_s - time.monotonic())
            self._deadline = asyncio.get_running_loop().call_later(left_s, stream.fail, RequestTimeoutError(
                f"request ran longer than --request-timeout {state.request_timeout_s:g} s and was aborted; "
                f"lower max_tokens, or ask the operator to raise --request-timeout"))

    async def _watch(self, request: Request) -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        self.stream.fail(ClientDisconnected())

    async def next(self) -> dict[str, RequestOutput]:
        self.latest = await self.stream.next()
        return self.latest

    async def until_finished(self) -> dict[str, RequestOutput]:
        while True:
            latest = await self.next()
            if self.stream.is_finished(latest):
                return latest

    def cancel(self) -> None:
        self.stream.fail(Cancelled())

    def close(self) -> None:
        self._disconnect.cancel()
        if self._deadline is not None:
            self._deadline.cancel()
        if not self.stream.is_finished():
            self.state.engine.abort(self.stream)
        for key in [k for k, v in self.state.inflight.items() if v is self]:
            del self.state.inflight[key]
        self.closed.set()


async def read_json(request: Request, limit_bytes: int) -> dict:
    """The body as a JSON object, refused before parsing when it cannot be one a client meant: too large, not
    sent as JSON (a browser page's text/plain or form POST), nested deeper than MAX_JSON_DEPTH (Python's
    parser recurses), or holding a lone UTF-16 surrogate (no tokenizer can encode it)."""
    content_type = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if content_type != "application/json" and not content_type.endswith("+json"):
        raise UnsupportedMediaTypeError(f"send the body as JSON with content-type: application/json, not "
                                        f"{echo(content_type)}")
    raw = await read_body(request, limit_bytes)
    # A body of megabytes takes a tenth of a second to parse, most of it (the depth check's numpy) without the GIL.
    return await asyncio.to_thread(_parse_body, raw) if len(raw) > PARSE_IN_THREAD_BYTES else _parse_body(raw)


def _parse_body(raw: bytes) -> dict:
    check_depth(raw, "request body")
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise InvalidRequestError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequestError("request body must be a JSON object")
    try:
        # Raw UTF-8 cannot hold a surrogate (json.loads refuses it), only a \uD8xx-\uDFxx escape can: re-encode
        # the parsed body only when one is there, not for every request.
        if _SURROGATE_ESCAPE.search(raw):
            json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequestError("request body holds a lone UTF-16 surrogate escape (such as \\ud800) that is "
                                  "not valid Unicode; send valid text") from None
    return body


def usage(outputs: list[RequestOutput]) -> dict:
    prompt = sum(len(o.prompt_token_ids) for o in outputs)
    completion = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    cached = sum(o.num_cached_tokens for o in outputs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


async def run_generation(request: Request, handler: Handler) -> Response:
    state: ServerState = request.app.state.tally
    arrival_s, arrival_unix_s = time.monotonic(), time.time()
    inflight: Inflight | None = None
    handed_off = False  # a streaming response owns the request from then on
    ctx: Ctx | None = None
    try:
        if state.draining:
            raise ServerDrainingError()
        req = handler.parse(await read_json(request, state.max_body_bytes))
        lora = state.check_model(req.model)
        state.check_task("generate", handler.path)
        items = await asyncio.to_thread(handler.engine_requests, req, state)  # tokenizes, renders templates
        request_id = f"{handler.id_prefix}-{uuid.uuid4().hex}"
        rids = [f"{request_id}-{i}" for i in range(len(items))]
        stream = state.engine.submit([(rid, p, sp) for rid, (p, sp) in zip(rids, items)], arrival_s, req.priority,
                                     lora)
        inflight = Inflight(state, request, stream, arrival_s)
        state.inflight[request_id] = inflight
        ctx = Ctx(request_id, int(arrival_unix_s), state.model_name if lora is None else lora.lora_name, req, rids,
                  arrival_unix_s=arrival_unix_s, max_tokens=[sp.max_tokens for _, sp in items],
                  prompts=[p for p, _ in items])
        await stream.accepted
        if req.stream:
            handed_off = True
            return EventStreamResponse(_events(state, handler, ctx, inflight))
        latest = await inflight.until_finished()
    except ClientDisconnected:
        state.metrics.count_success(handler.path, "abort")
        return Response(status_code=499)
    except Cancelled:
        state.metrics.count_success(handler.path, "abort")
        ctx.cancelled = True
        return JSONResponse(handler.response(ctx, [inflight.latest.get(rid) for rid in rids], state))
    except Exception as exc:  # noqa: BLE001 - every failure becomes one error of the API's shape
        return error_response(record_failure(state, handler.path, exc), handler.framing.error_body)
    finally:
        # Also on cancellation (drain timeout): the engine must not keep computing for nobody.
        if inflight is not None and not handed_off:
            inflight.close()
    outputs = [latest[rid] for rid in rids]
    _record_success(state, handler.path, ctx, outputs)
    return JSONResponse(handler.response(ctx, outputs, state))


async def _events(state: ServerState, handler: Handler, ctx: Ctx, inflight: Inflight) -> AsyncIterator[bytes]:
    recorded = False
    framing = handler.framing
    outputs: list[RequestOutput | None] = [None] * len(ctx.request_ids)
    try:
        opening = framing.frame(handler.opening(ctx))
        if opening:
            yield opening
        while True:
            try:
                latest = await inflight.next()
            except Cancelled:
                ctx.cancelled = True
                break
            outputs = [latest.get(rid) for rid in ctx.request_ids]
            events = handler.events(ctx, outputs)
            if events:
                yield framing.frame(events)
                _note_sent(state, handler.path, ctx, outputs)
            if inflight.stream.is_finished(latest):
                break
        yield framing.frame(handler.closing(ctx, outputs))
        if not ctx.cancelled:
            _record_success(state, handler.path, ctx, outputs)
            recorded = True
    except ClientDisconnected:
        return
    except Exception as exc:  # noqa: BLE001 - headers are sent: the error travels as an event
        recorded = True
        yield framing.frame([framing.stream_error(record_failure(state, handler.path, exc))])
    finally:
        inflight.close()
        if not recorded:  # client went away (disconnect, or the server cancelled us while draining), or a cancel
            state.metrics.count_success(handler.path, "abort")
    yield framing.done


def _record_success(state: ServerState, endpoint: str, ctx: Ctx, outputs: list[RequestOutput]) -> None:
    for out, max_tokens in zip(outputs, ctx.max_tokens, strict=True):
        allowed = max_tokens_or_default(max_tokens, state.sampling_defaults,
                                        state.max_model_len - len(out.prompt_token_ids))
        state.metrics.observe_output(endpoint, out, ctx.times.get(out.request_id), allowed)
        m = out.metrics
        log.info("%s %s: %d prompt + %d output tokens, %s, TTFT %.3f s, E2E %.3f s", endpoint, out.request_id,
                 len(out.prompt_token_ids), sum(len(c.token_ids) for c in out.outputs),
                 out.outputs[0].finish_reason, (m.ttft_s or 0.0) if m else 0.0, (m.e2e_s or 0.0) if m else 0.0)
    state.metrics.count_success(endpoint, outputs[0].outputs[0].finish_reason or "abort")
    if state.request_log is not None:
        state.request_log.write(endpoint, ctx.req, ctx.arrival_unix_s, outputs)


def _note_sent(state: ServerState, endpoint: str, ctx: Ctx, outputs: list[RequestOutput | None]) -> None:
    """Server-side token times of each engine request, for TTFT and ITL as the client sees them."""
    now = time.monotonic()
    for out in outputs:
        if out is None:
            continue
        n_tokens = sum(len(c.token_ids) for c in out.outputs)
        t = ctx.times.setdefault(out.request_id, StreamTimes())
        new = n_tokens - t.num_tokens_sent
        if new <= 0:
            continue
        # every token after a stream's first counts once, however the chunks grouped them (a stream sends the
        # latest output when it gets to write: several tokens may go in its first chunk)
        state.metrics.observe_itl(endpoint, None if t.last_token_sent_s is None else now - t.last_token_sent_s, new)
        if t.first_token_sent_s is None:
            t.first_token_sent_s = now
        t.last_token_sent_s, t.num_tokens_sent = now, n_tokens


def record_failure(state: ServerState, endpoint: str, exc: BaseException):
    err = as_tally_error(exc)
    reason = rejection_reason(err)
    if reason is not None:
        state.metrics.count_rejected(endpoint, reason)
    elif isinstance(err, RequestTimeoutError):
        state.metrics.count_timeout(endpoint)
    else:
        state.metrics.count_error(endpoint, err.http_status)
    # 500s are logged by error_response; here the other server-side failures (an engine that died)
    if err.http_status > 500 and not isinstance(err, (RequestTimeoutError, ServerDrainingError)):
        log.error("request failed: %s", err.message, exc_info=err.__cause__ or err)
    return err
