"""The life of one pooling request (/v1/embeddings, /v1/score, /v1/rerank): read and validate → tokenize → submit
one engine request per text → wait (racing client disconnect and --request-timeout) → one JSON body, counting one
outcome. The endpoint modules only translate formats; nothing streams."""
from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from tally.errors import InvalidRequestError
from tally.models.tokenizer import encode_within
from tally.outputs import EmbeddingRequestOutput
from tally.pooling_params import PoolingParams
from tally.server.errors import ServerDrainingError, error_response
from tally.server.lifecycle import ClientDisconnected, Inflight, ServerState, read_json, record_failure


@dataclass
class PoolingCtx:
    request_id: str
    created_s: int
    req: Any


class PoolingHandler(Protocol):
    path: str
    id_prefix: str
    input_field: str  # the body field holding the texts: an engine error about "prompt" names it instead
    tasks: tuple[str, ...]  # the model tasks that serve it, any one of them

    def parse(self, body: dict) -> Any: ...  # the request, with at least `model`
    def engine_requests(self, req: Any, state: ServerState) -> list[tuple[Any, PoolingParams]]: ...
    def response(self, ctx: PoolingCtx, outputs: list[EmbeddingRequestOutput], state: ServerState) -> dict: ...


def tokenized(state: ServerState, text: str, param: str, keep_last: int | None = None,
              add_special_tokens: bool = True) -> dict:
    """A text as the engine takes it, tokenized here (off the engine thread); an empty text is refused by name."""
    if not text:
        raise InvalidRequestError(f"{param} is an empty string; send text to embed", param=param)
    ids = encode_within(state.tokenizer, text, state.max_model_len, param=param, keep_last=keep_last,
                        add_special_tokens=add_special_tokens)
    return {"prompt": text, "prompt_token_ids": ids}


def prompt_tokens(outputs: list[EmbeddingRequestOutput]) -> dict:
    n = sum(len(o.prompt_token_ids) for o in outputs)
    return {"prompt_tokens": n, "total_tokens": n}


async def run_pooling(request: Request, handler: PoolingHandler) -> Response:
    state: ServerState = request.app.state.tally
    arrival_s, created_s = time.monotonic(), int(time.time())
    inflight: Inflight | None = None
    try:
        if state.draining:
            raise ServerDrainingError()
        req = handler.parse(await read_json(request, state.max_body_bytes))
        if state.check_model(req.model) is not None:
            raise InvalidRequestError(f"{handler.path} runs on the base model; LoRA adapters serve generation only: "
                                      f"send model {state.model_name!r}", param="model")
        if not set(handler.tasks) & set(state.supported_tasks):
            state.check_task(handler.tasks[0], handler.path)
        items = await asyncio.to_thread(handler.engine_requests, req, state)
        request_id = f"{handler.id_prefix}-{uuid.uuid4().hex}"
        rids = [f"{request_id}-{i}" for i in range(len(items))]
        stream = state.engine.submit([(rid, p, params) for rid, (p, params) in zip(rids, items)], arrival_s)
        inflight = Inflight(state, request, stream, arrival_s)
        await stream.accepted
        latest = await inflight.until_finished()
    except ClientDisconnected:
        state.metrics.count_success(handler.path, "abort")
        return Response(status_code=499)
    except Exception as exc:  # noqa: BLE001 - every failure becomes one error body
        if isinstance(exc, InvalidRequestError) and exc.param in ("prompt", "n"):
            exc.param = handler.input_field  # the engine's prompt is this API's input
        return error_response(record_failure(state, handler.path, exc))
    finally:
        if inflight is not None:
            inflight.close()
    state.metrics.count_success(handler.path, "stop")
    return JSONResponse(handler.response(PoolingCtx(request_id, created_s, req), [latest[r] for r in rids], state))
