"""The FastAPI app: OpenAI routes, health, Prometheus metrics, tokenizer helpers and the live ledger."""
from __future__ import annotations

import asyncio
import contextlib
import copy
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from tally.engine.async_engine import AsyncEngine
from tally.engine.engine import Engine
from tally.errors import EngineDeadError, InvalidRequestError, ModelNotFoundError, echo
from tally.metric_names import METRICS_PREFIXES
from tally.models.template_workers import TemplateLimits, TemplateWorkers
from tally.models.tokenizer_worker import LONG_TEXT_CHARS, TokenizerWorker, ids_json
from tally.server.allowed_hosts import AllowedHosts, AllowedHostsMiddleware
from tally.server.auth import APIKeyMiddleware
from tally.server.chat import ChatCompletions, chat_text
from tally.server.completions import Completions
from tally.server.embeddings import Embeddings
from tally.server.errors import error_response
from tally.server.lifecycle import ServerState, read_json, run_generation
from tally.server.lora_routes import adapter_cards, add_lora_routes
from tally.server.messages import Messages
from tally.server.pooling_lifecycle import run_pooling
from tally.server.responses import Responses
from tally.server.responses_store import ResponsesStore
from tally.server.metrics import ServerMetrics, cache_config_info
from tally.server.protocol import DetokenizeRequest, TokenizeRequest
from tally.server.reasoning import reasoning_parser
from tally.server.request_log import RequestLog
from tally.server.scoring import Rerank, Score
from tally.version import __version__


CANCEL_WAIT_S = 5.0  # a cancel answers with the cancelled response once its request has let go, or after this


@dataclass(frozen=True)
class ServerConfig:
    max_queue: int | None = None  # engine requests allowed to wait; None: unbounded
    max_queue_delay_s: float | None = None  # refuse when the predicted wait for a slot is longer
    request_timeout_s: float | None = None  # None: no limit
    max_body_bytes: int = 16 * 2**20
    restart_on_failure: bool = False  # a dead engine loop is rebuilt from the same config
    # Host header values served; ("*",) any. A loopback server defaults to loopback names, so a web page whose
    # domain an attacker re-points at 127.0.0.1 (DNS rebinding) cannot reach it.
    allowed_hosts: tuple[str, ...] = ("*",)
    request_log: RequestLog | None = None  # --request-log: one JSON line per finished request
    api_key: str | None = None  # --api-key: bearer authentication on /v1/*, /tokenize and /detokenize
    tool_call_parser: str | None = None  # --enable-auto-tool-choice --tool-call-parser NAME
    chat_template: str | None = None  # --chat-template: the template text used instead of the model's
    trust_request_chat_template: bool = False  # --trust-request-chat-template: render a request's own template
    metrics_prefix: str = "tally"  # --metrics-prefix vllm: the same series under vllm:
    responses_store_size: int = 1000  # --responses-store-size: finished responses kept for previous_response_id
    reasoning_parser: str | None = None  # --reasoning-parser NAME: chat returns the thinking apart


def build_app(engine: Engine, config: ServerConfig = ServerConfig()) -> FastAPI:
    async_engine = AsyncEngine(engine, config.max_queue, config.restart_on_failure, config.max_queue_delay_s)
    tokenizer = copy.deepcopy(engine.tokenizer)  # the engine thread keeps the original to itself
    state = ServerState(
        engine=async_engine, metrics=ServerMetrics(engine.model_name, lambda: async_engine.snapshot,
                                                   METRICS_PREFIXES[config.metrics_prefix],
                                                   cache_config_info(engine.config)),
        tokenizer=tokenizer, model_name=engine.model_name, model_names=engine.model_names,
        max_model_len=engine.max_model_len, sampling_defaults=engine.sampling_defaults,
        request_timeout_s=config.request_timeout_s, max_body_bytes=config.max_body_bytes,
        request_log=config.request_log, supported_tasks=engine.supported_tasks, loras=dict(engine.served_loras),
    )
    ledger = engine.ledger.to_dict()
    started_s = int(time.time())
    templates = TemplateWorkers(TemplateLimits.for_body_limit(config.max_body_bytes))
    request_templates = TemplateWorkers(templates.limits.for_requests(), max_workers=2)
    long_texts = TokenizerWorker(tokenizer)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        async_engine.start()
        templates.start()
        if config.trust_request_chat_template:
            request_templates.start()
        yield
        async_engine.stop()
        templates.close()
        request_templates.close()
        long_texts.close()

    app = FastAPI(title="Tally", lifespan=lifespan)
    if config.api_key:
        app.add_middleware(APIKeyMiddleware, api_key=config.api_key)
    if "*" not in config.allowed_hosts:
        app.add_middleware(AllowedHostsMiddleware, allowed=AllowedHosts(config.allowed_hosts))
    app.state.tally = state
    completions = Completions(tokenizer)
    chat = ChatCompletions(tokenizer, templates.render, config.tool_call_parser, config.chat_template,
                           request_templates.render if config.trust_request_chat_template else None,
                           reasoning_parser(config.reasoning_parser) if config.reasoning_parser else None)
    messages = Messages(chat)
    responses = Responses(chat, ResponsesStore(config.responses_store_size))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            return error_response(ModelNotFoundError(f"no route {request.url.path}; see /docs for the API"))
        err = InvalidRequestError(f"{request.method} {request.url.path}: {exc.detail}")
        err.http_status = exc.status_code
        return error_response(err)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(exc)

    @app.post("/v1/completions")
    async def create_completion(request: Request) -> Response:
        return await run_generation(request, completions)

    @app.post("/v1/chat/completions")
    async def create_chat_completion(request: Request) -> Response:
        return await run_generation(request, chat)

    @app.post("/v1/messages")
    async def create_message(request: Request) -> Response:
        return await run_generation(request, messages)

    @app.post("/v1/messages/count_tokens")
    async def count_message_tokens(request: Request) -> Response:
        try:
            body = await read_json(request, state.max_body_bytes)
            return JSONResponse(await asyncio.to_thread(messages.count_tokens, body, state))
        except Exception as exc:  # noqa: BLE001
            return error_response(exc, messages.framing.error_body)

    @app.post("/v1/responses")
    async def create_response(request: Request) -> Response:
        return await run_generation(request, responses)

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str) -> Response:
        try:
            return JSONResponse(responses.get(response_id, state))
        except Exception as exc:  # noqa: BLE001
            return error_response(exc)

    @app.post("/v1/responses/{response_id}/cancel")
    async def cancel_response(response_id: str) -> Response:
        """Ends a response in progress; its client gets what was generated, with status "cancelled"."""
        try:
            inflight = state.inflight.get(response_id) if response_id.startswith(responses.id_prefix) else None
            if inflight is None:
                responses.get(response_id, state)  # 404 when unknown
                raise InvalidRequestError(f"response {echo(response_id)} has finished; only a response in progress "
                                          "can be cancelled", param="response_id")
            inflight.cancel()
            with contextlib.suppress(asyncio.TimeoutError):  # a stream's client may be slow to take its last events
                await asyncio.wait_for(inflight.closed.wait(), CANCEL_WAIT_S)
            with contextlib.suppress(ModelNotFoundError):  # stored unless the request said store: false
                return JSONResponse(responses.get(response_id, state))
            return JSONResponse({"id": response_id, "object": "response", "status": "cancelled"})
        except Exception as exc:  # noqa: BLE001
            return error_response(exc)

    embeddings, score, rerank = Embeddings(), Score(), Rerank()

    @app.post("/v1/embeddings")
    async def create_embedding(request: Request) -> Response:
        return await run_pooling(request, embeddings)

    @app.post("/v1/score")
    @app.post("/score")
    async def create_score(request: Request) -> Response:
        return await run_pooling(request, score)

    @app.post("/v1/rerank")
    @app.post("/rerank")
    @app.post("/v2/rerank")
    async def create_rerank(request: Request) -> Response:
        return await run_pooling(request, rerank)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{
            "id": name, "object": "model", "created": started_s, "owned_by": "tally",
            "root": state.model_name, "max_model_len": state.max_model_len} for name in state.model_names]
            + adapter_cards(state, started_s)}

    add_lora_routes(app, state, async_engine)

    @app.get("/version")
    async def version() -> dict:
        return {"version": __version__}

    @app.get("/health")
    async def health() -> Response:
        if not async_engine.is_alive:
            return error_response(EngineDeadError("the engine loop is not running; see the server log"))
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    # Rendering and tokenizing run off the event loop: a text as long as the body limit takes seconds (any length
    # within it is taken: counting a long document is the use of /tokenize), and a long one in a worker process.
    @app.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        try:
            req = TokenizeRequest.model_validate(await read_json(request, state.max_body_bytes))
            state.check_model(req.model)
            if req.messages is not None:  # the template holds any BOS it wants
                text = await asyncio.to_thread(chat_text, tokenizer, req.messages, req.add_generation_prompt,
                                               chat_template=config.chat_template, renderer=templates.render)
                add_special_tokens = False
            elif req.prompt is not None:
                text, add_special_tokens = req.prompt, req.add_special_tokens
            else:
                raise InvalidRequestError("send `prompt` (text) or `messages` (chat)", param="prompt")
            if len(text) > LONG_TEXT_CHARS:
                count, ids = await long_texts.encode_json(text, add_special_tokens)
            else:
                count, ids = await asyncio.to_thread(short_text_ids, text, add_special_tokens)
            return Response(b'{"count":%d,"max_model_len":%d,"tokens":%s}' % (count, state.max_model_len, ids),
                            media_type="application/json")
        except Exception as exc:  # noqa: BLE001
            return error_response(exc)

    def short_text_ids(text: str, add_special_tokens: bool) -> tuple[int, bytes]:
        ids = tokenizer.encode(text, add_special_tokens=add_special_tokens)
        return len(ids), ids_json(ids)

    @app.post("/detokenize")
    async def detokenize(request: Request) -> Response:
        try:
            req = DetokenizeRequest.model_validate(await read_json(request, state.max_body_bytes))
            state.check_model(req.model)
            return await asyncio.to_thread(detokenized, req)
        except Exception as exc:  # noqa: BLE001
            return error_response(exc)

    def detokenized(req: DetokenizeRequest) -> Response:
        vocab = len(tokenizer)
        bad = [t for t in req.tokens if not 0 <= t < vocab]
        if bad:
            raise InvalidRequestError(f"token ids {bad[:5]} are outside the vocabulary [0, {vocab})", param="tokens")
        return JSONResponse({"prompt": tokenizer.decode(req.tokens)})

    @app.get("/ledger")
    async def live_ledger() -> dict:
        return ledger_view(ledger, async_engine)

    return app


def ledger_view(ledger: dict, async_engine: AsyncEngine) -> dict:
    """The start-up ledger (the plan) beside the live state of the KV pool and the queues."""
    s = async_engine.snapshot
    used_slots = s.num_used_blocks * s.block_size_tokens
    return {
        "model": ledger["model_name"],
        "weights_bytes": ledger["weight_bytes"],
        "kv": {
            "bytes_per_token": ledger["kv_bytes_per_token"],
            "pool_bytes": ledger["kv_pool_bytes"],
            "block_size_tokens": s.block_size_tokens,
            "blocks_total": s.num_blocks,
            "blocks_used": s.num_used_blocks,
            "blocks_free": s.num_free_blocks,
            "blocks_cached_free": s.num_cached_free_blocks,
            "usage_perc": s.kv_usage,
            "fragmentation_perc": s.num_unfilled_slots / used_slots if used_slots else 0.0,
        },
        "requests": {"running": s.num_running, "waiting": s.num_waiting, "queued": async_engine.queue_depth()},
        "prefix_cache": {"queried_tokens": s.prefix_queried_tokens, "hit_tokens": s.prefix_hit_tokens,
                         "hit_rate": s.prefix_hit_rate},
        "num_preemptions": s.num_preemptions,
        "engine_steps": s.num_steps,
        "speculative_decoding": None if s.speculation is None else {
            "num_drafts": s.speculation.num_drafts, "num_draft_tokens": s.speculation.num_draft_tokens,
            "num_accepted_tokens": s.speculation.num_accepted_tokens,
            "acceptance_rate": s.speculation.acceptance_rate,
            "accepted_per_position": s.speculation.accepted_per_position,
            "num_speculative_tokens": s.speculation.last_num_speculative_tokens},
        "swap_space": None if s.swap is None else {
            "capacity_bytes": s.swap.capacity_bytes, "held_bytes": s.swap.held_bytes,
            "usage_perc": s.swap.usage, "requests": s.swap.num_requests,
            "swapped_out_blocks": s.swap.swapped_out_blocks, "swapped_in_blocks": s.swap.swapped_in_blocks,
            "preemptions_swapped": s.swap.num_swapped,
            "out_s_per_block": s.swap.out_s_per_block, "in_s_per_block": s.swap.in_s_per_block,
            "last_swap_s": s.swap.last_swap_s, "last_recompute_s": s.swap.last_recompute_s},
        "disk_prefix_cache": None if s.disk_cache is None else {
            "capacity_bytes": s.disk_cache.capacity_bytes, "held_bytes": s.disk_cache.held_bytes,
            "files": s.disk_cache.num_files, "queried_tokens": s.disk_cache.queried_tokens,
            "hit_tokens": s.disk_cache.hit_tokens, "written_blocks": s.disk_cache.written_blocks,
            "dropped_blocks": s.disk_cache.dropped_writes, "damaged_files": s.disk_cache.damaged_files,
            "write_errors": s.disk_cache.write_errors},
        "plan": ledger,
    }
