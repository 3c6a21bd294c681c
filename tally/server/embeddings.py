"""POST /v1/embeddings: OpenAI's embeddings API (with vLLM's extra fields) over the engine's pooling requests.
`input` is a string, a list of strings, a list of token ids or a list of token-id lists; `encoding_format` base64
is the float32 little-endian bytes, as OpenAI's clients decode them."""
from __future__ import annotations

import base64
from typing import Any, Literal

import numpy as np
from pydantic import Field

from tally.errors import InvalidRequestError
from tally.outputs import EmbeddingRequestOutput
from tally.pooling_params import PoolingParams
from tally.server.lifecycle import ServerState
from tally.server.pooling_lifecycle import PoolingCtx, prompt_tokens, tokenized
from tally.server.protocol import OpenAIModel, refuse_unsupported

INPUT_SHAPES = "a string, a list of strings, a list of token ids, or a list of token-id lists"


class EmbeddingRequest(OpenAIModel):
    model: str | None = None
    input: Any = Field(...)
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    truncate_prompt_tokens: int | None = None  # vLLM's: keep each input's last k tokens
    add_special_tokens: bool = True  # vLLM's
    normalize: bool | None = None  # vLLM's: None keeps the model's pooler config


class Embeddings:
    path = "/v1/embeddings"
    id_prefix = "embd"
    input_field = "input"
    tasks = ("embed",)

    def parse(self, body: dict) -> EmbeddingRequest:
        refuse_unsupported(body, EmbeddingRequest, frozenset())
        return EmbeddingRequest.model_validate(body)

    def engine_requests(self, req: EmbeddingRequest, state: ServerState) -> list[tuple[Any, PoolingParams]]:
        params = PoolingParams(req.dimensions, req.normalize, req.truncate_prompt_tokens)
        inputs = embedding_inputs(req.input)
        state.engine.check_fan_out(len(inputs), len(inputs))  # before tokenizing them all
        return [(tokenized(state, x, f"input[{i}]" if len(inputs) > 1 else "input", req.truncate_prompt_tokens,
                           req.add_special_tokens) if isinstance(x, str) else x, params)
                for i, x in enumerate(inputs)]

    def response(self, ctx: PoolingCtx, outputs: list[EmbeddingRequestOutput], state: ServerState) -> dict:
        encode = _base64 if ctx.req.encoding_format == "base64" else list
        return {"id": ctx.request_id, "object": "list", "created": ctx.created_s, "model": state.model_name,
                "data": [{"object": "embedding", "index": i, "embedding": encode(o.outputs.embedding)}
                         for i, o in enumerate(outputs)],
                "usage": prompt_tokens(outputs)}


def embedding_inputs(value: Any) -> list[str | list[int]]:
    """The texts or token-id lists of `input`, one engine request each."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise InvalidRequestError(f"input must be {INPUT_SHAPES}", param="input")
    if not value:
        raise InvalidRequestError("input is an empty list; send at least one text", param="input")
    if all(_is_id(t) for t in value):
        return [value]
    if all(isinstance(t, str) for t in value):
        return value
    if all(isinstance(t, list) for t in value):
        for i, ids in enumerate(value):
            if not ids or not all(_is_id(t) for t in ids):
                raise InvalidRequestError(f"input[{i}] must be a non-empty list of token ids", param="input")
        return value
    raise InvalidRequestError(f"input must be {INPUT_SHAPES}, not a mix", param="input")


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _base64(vector: list[float]) -> str:
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
