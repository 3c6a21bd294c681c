"""POST /v1/chat/completions: messages through the model's chat template, OpenAI's chat format back.
`response_format` constrains decoding (tally/engine/structured_output.py), so the answer is the JSON asked for."""
from __future__ import annotations

from typing import Any

from tally.errors import InvalidRequestError
from tally.models.chat_template import chat_prompt, refuse_without_template
from tally.outputs import Logprob, RequestOutput
from tally.sampling_params import MAX_LOGPROBS, SamplingParams
from tally.server.lifecycle import Ctx, ServerState, usage
from tally.server.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    finite,
    refuse_unsupported,
)
from tally.server.streaming import Delta, deltas


def render_chat(tokenizer: Any, messages: list[ChatMessage], add_generation_prompt: bool = True) -> dict:
    """Chat messages → the engine's prompt (text and ids); also used by POST /tokenize."""
    convo = [{"role": m.role, "content": m.text(), **({"name": m.name} if m.name else {})} for m in messages]
    return chat_prompt(tokenizer, convo, without_template=refuse_without_template,
                       add_generation_prompt=add_generation_prompt)


class ChatCompletions:
    path = "/v1/chat/completions"
    id_prefix = "chatcmpl"
    chunk_object = "chat.completion.chunk"

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def parse(self, body: dict) -> ChatCompletionRequest:
        refuse_unsupported(body, ChatCompletionRequest)
        return ChatCompletionRequest.model_validate(body)

    def engine_requests(self, req: ChatCompletionRequest, state: ServerState) -> list[tuple[Any, SamplingParams]]:
        if req.top_logprobs is not None and not req.logprobs:
            raise InvalidRequestError("top_logprobs needs logprobs: true", param="top_logprobs")
        if req.top_logprobs is not None and not 0 <= req.top_logprobs <= MAX_LOGPROBS:
            raise InvalidRequestError(f"top_logprobs must be between 0 and {MAX_LOGPROBS}, got {req.top_logprobs}",
                                      param="top_logprobs")
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        params = req.to_sampling_params(max_tokens, (req.top_logprobs or 0) if req.logprobs else None)
        return [(render_chat(self.tokenizer, req.messages, req.add_generation_prompt), params)]

    # -- responses -----------------------------------------------------------------------------
    def response(self, ctx: Ctx, outputs: list[RequestOutput], state: ServerState) -> dict:
        req: ChatCompletionRequest = ctx.req
        choices = []
        for d in deltas({}, outputs):
            choices.append({"index": d.choice.index, "message": {"role": "assistant", "content": d.text},
                            "logprobs": self._logprobs(d, req.top_logprobs or 0), "finish_reason": d.finish_reason})
        return {"id": ctx.request_id, "object": "chat.completion", "created": ctx.created_s, "model": ctx.model,
                "choices": choices, "usage": usage(outputs)}

    def chunks(self, ctx: Ctx, outputs: list[RequestOutput | None]) -> list[dict]:
        out = []
        for d in deltas(ctx.sent, outputs):
            logprobs = self._logprobs(d, ctx.req.top_logprobs or 0)
            if not (d.text or d.first or d.finish_reason or logprobs):
                continue  # tokens whose text is still held back (a possible stop string, a partial character)
            delta: dict = {"role": "assistant", "content": d.text} if d.first else {"content": d.text}
            if not d.text and not d.first:
                delta = {}
            out.append({"id": ctx.request_id, "object": self.chunk_object, "created": ctx.created_s,
                        "model": ctx.model, "choices": [{"index": d.choice.index, "delta": delta,
                                                         "logprobs": logprobs,
                                                         "finish_reason": d.finish_reason}]})
        return out

    def _logprobs(self, d: Delta, top_k: int) -> dict | None:
        c = d.choice
        if c.logprobs is None:
            return None
        end = len(c.token_ids)
        content = []
        for tid, entry in zip(c.token_ids[d.token_start:end], c.logprobs[d.token_start:end]):
            chosen = entry.get(tid) or Logprob(float("-inf"), None, self.tokenizer.decode([tid]))
            top = sorted(entry.values(), key=lambda x: -x.logprob)[:top_k]
            content.append({**_token(chosen), "top_logprobs": [_token(t) for t in top]})
        return {"content": content}


def _token(lp: Logprob) -> dict:
    text = lp.decoded_token or ""
    return {"token": text, "logprob": finite(lp.logprob), "bytes": list(text.encode())}

