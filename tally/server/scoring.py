"""POST /v1/score (vLLM's text_1 / text_2) and POST /v1/rerank, /rerank, /v2/rerank (vLLM's, Jina's and Cohere's
query / documents / top_n / return_documents): with a cross-encoder each pair is one input and the model's score; with
an embedding model each distinct text is embedded once and a pair's score is the cosine of its two embeddings
(tally/engine/scoring.py)."""
from __future__ import annotations

from typing import Any

from pydantic import Field

from tally.engine.scoring import cosine, pair_prompt, score_pairs
from tally.errors import InvalidRequestError
from tally.outputs import EmbeddingRequestOutput
from tally.pooling_params import PoolingParams
from tally.server.lifecycle import ServerState
from tally.server.pooling_lifecycle import PoolingCtx, prompt_tokens, tokenized
from tally.server.protocol import OpenAIModel, refuse_unsupported


class ScoreRequest(OpenAIModel):
    model: str | None = None
    text_1: str | list[str] = Field(...)
    text_2: str | list[str] = Field(...)
    truncate_prompt_tokens: int | None = None
    user: str | None = None


class RerankDocument(OpenAIModel):
    text: str


class RerankRequest(OpenAIModel):
    model: str | None = None
    query: str = Field(...)
    documents: list[str | RerankDocument] = Field(...)
    top_n: int | None = None  # 0 or unset: every document
    return_documents: bool = True  # Jina's default; Cohere clients send false to get indices only
    truncate_prompt_tokens: int | None = None
    user: str | None = None


class _Scoring:
    """Both endpoints: a cross-encoder's pairs, or the distinct texts of a request's pairs, embedded once each."""

    input_field: str
    tasks = ("embed", "score")  # an embedding model's cosines, or a cross-encoder's scores

    def pairs(self, req: Any) -> list[tuple[str, str]]:
        raise NotImplementedError

    def parse_as(self, body: dict, model: type[OpenAIModel]) -> Any:
        refuse_unsupported(body, model, frozenset())
        return model.model_validate(body)

    def engine_requests(self, req: Any, state: ServerState) -> list[tuple[Any, PoolingParams]]:
        pairs = self.pairs(req)
        if "score" in state.supported_tasks:
            state.engine.check_fan_out(len(pairs), len(pairs))
            return [(pair_prompt(state.tokenizer, a, b, state.max_model_len, self.input_field,
                                 req.truncate_prompt_tokens), PoolingParams()) for a, b in pairs]
        texts = _distinct(pairs)
        state.engine.check_fan_out(len(texts), len(texts))
        params = PoolingParams(truncate_prompt_tokens=req.truncate_prompt_tokens)
        return [(tokenized(state, t, self.input_field, req.truncate_prompt_tokens), params) for t in texts]

    def scores(self, req: Any, outputs: list[EmbeddingRequestOutput], state: ServerState) -> list[float]:
        if "score" in state.supported_tasks:  # a cross-encoder's pairs, in order
            return [o.outputs.embedding[0] for o in outputs]
        vectors = {o.prompt: o.outputs.embedding for o in outputs}
        return [cosine(vectors[a], vectors[b]) for a, b in self.pairs(req)]


class Score(_Scoring):
    path = "/v1/score"
    id_prefix = "score"
    input_field = "text_2"

    def parse(self, body: dict) -> ScoreRequest:
        return self.parse_as(body, ScoreRequest)

    def pairs(self, req: ScoreRequest) -> list[tuple[str, str]]:
        _refuse_empty("text_1", req.text_1)
        _refuse_empty("text_2", req.text_2)
        return score_pairs(req.text_1, req.text_2, str)

    def response(self, ctx: PoolingCtx, outputs: list[EmbeddingRequestOutput], state: ServerState) -> dict:
        return {"id": ctx.request_id, "object": "list", "created": ctx.created_s, "model": state.model_name,
                "data": [{"index": i, "object": "score", "score": s}
                         for i, s in enumerate(self.scores(ctx.req, outputs, state))],
                "usage": prompt_tokens(outputs)}


class Rerank(_Scoring):
    path = "/v1/rerank"
    id_prefix = "rerank"
    input_field = "documents"

    def parse(self, body: dict) -> RerankRequest:
        req = self.parse_as(body, RerankRequest)
        if req.top_n is not None and req.top_n < 0:
            raise InvalidRequestError(f"top_n must be ≥ 0 (0: every document), got {req.top_n}", param="top_n")
        return req

    def pairs(self, req: RerankRequest) -> list[tuple[str, str]]:
        if not req.documents:
            raise InvalidRequestError("documents is empty; send at least one document", param="documents")
        _refuse_empty("query", req.query)
        _refuse_empty("documents", [_text(d) for d in req.documents])
        return [(req.query, _text(d)) for d in req.documents]

    def response(self, ctx: PoolingCtx, outputs: list[EmbeddingRequestOutput], state: ServerState) -> dict:
        req: RerankRequest = ctx.req
        ranked = sorted(enumerate(self.scores(req, outputs, state)), key=lambda r: -r[1])
        results = [{"index": i, "relevance_score": s, **({"document": {"text": _text(req.documents[i])}}
                                                        if req.return_documents else {})}
                   for i, s in ranked[:req.top_n or None]]
        return {"id": ctx.request_id, "model": state.model_name, "results": results, "usage": prompt_tokens(outputs)}


def _refuse_empty(name: str, texts: str | list[str]) -> None:
    empty = [i for i, t in enumerate([texts] if isinstance(texts, str) else texts) if not t]
    if empty:
        where = name if isinstance(texts, str) else f"{name}[{empty[0]}]"
        raise InvalidRequestError(f"{where} is an empty string; send text to score", param=name)


def _text(document: str | RerankDocument) -> str:
    return document if isinstance(document, str) else document.text


def _distinct(pairs: list[tuple[str, str]]) -> list[str]:
    return list(dict.fromkeys(t for pair in pairs for t in pair))
