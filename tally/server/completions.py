"""POST /v1/completions: OpenAI's legacy completions format over the engine's outputs.

`echo: true, logprobs: k, max_tokens: 0` scores the prompt (its tokens' logprobs), which is
what lm-evaluation-harness's `local-completions` model needs for loglikelihood tasks."""
from __future__ import annotations

from typing import Any

from tally.errors import InvalidRequestError
from tally.models.tokenizer import Tokenizer, encode_within
from tally.outputs import Logprob, RequestOutput
from tally.sampling_params import SamplingParams
from tally.server.lifecycle import Ctx, OpenAIStream, ServerState, usage
from tally.server.protocol import CompletionRequest, finite, refuse_unsupported
from tally.server.streaming import Delta, deltas


class Completions(OpenAIStream):
    path = "/v1/completions"
    id_prefix = "cmpl"
    chunk_object = "text_completion"

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def parse(self, body: dict) -> CompletionRequest:
        refuse_unsupported(body, CompletionRequest)
        return CompletionRequest.model_validate(body)

    def engine_requests(self, req: CompletionRequest, state: ServerState) -> list[tuple[Any, SamplingParams]]:
        if req.suffix:
            raise InvalidRequestError("suffix (fill-in-the-middle) is not supported; omit it", param="suffix")
        prompt_logprobs = None
        if req.echo and (req.logprobs is not None or req.max_tokens == 0):
            prompt_logprobs = req.logprobs or 0  # echo scores the prompt; max_tokens 0 needs it
        params = req.to_sampling_params(req.max_tokens, req.logprobs, prompt_logprobs, defaults=state.sampling_defaults)
        prompts = self._prompts(req.prompt)
        state.engine.check_fan_out(len(prompts), len(prompts) * params.n)  # before tokenizing them all
        return [(self._tokenized(p, state.max_model_len, params.truncate_prompt_tokens), params) for p in prompts]

    @staticmethod
    def _prompts(prompt: Any) -> list[Any]:
        if isinstance(prompt, str):
            prompts: list = [prompt]
        elif prompt and all(isinstance(t, int) for t in prompt):
            prompts = [prompt]
        else:
            prompts = list(prompt)
        if not prompts:
            raise InvalidRequestError("prompt is an empty list; send at least one prompt", param="prompt")
        return prompts

    def _tokenized(self, prompt: Any, max_model_len: int, keep_last: int | None) -> Any:
        """Text tokenized here, off the engine thread, so the step loop only sees token ids."""
        if not isinstance(prompt, str):
            return prompt
        ids = encode_within(self.tokenizer, prompt, max_model_len, param="prompt", keep_last=keep_last) if prompt \
            else []
        return {"prompt": prompt, "prompt_token_ids": ids}

    # -- responses -----------------------------------------------------------------------------
    def response(self, ctx: Ctx, outputs: list[RequestOutput], state: ServerState) -> dict:
        choices = [self._choice(ctx, d) for d in deltas({}, outputs)]
        return {"id": ctx.request_id, "object": "text_completion", "created": ctx.created_s, "model": ctx.model,
                "choices": choices, "usage": usage(outputs)}

    def chunks(self, ctx: Ctx, outputs: list[RequestOutput | None]) -> list[dict]:
        # A chunk for every step that made tokens, text or not (a skipped special token, a partial character or a
        # possible stop string held back), as vLLM's completions do: a stream's pace is the engine's, not its text's.
        choices = [(self._choice(ctx, d), len(d.choice.token_ids) > d.token_start) for d in deltas(ctx.sent, outputs)]
        return [{"id": ctx.request_id, "object": "text_completion", "created": ctx.created_s, "model": ctx.model,
                 "choices": [c]} for c, made_tokens in choices
                if made_tokens or c["text"] or c["logprobs"] or c["finish_reason"]]

    def _choice(self, ctx: Ctx, d: Delta) -> dict:
        req: CompletionRequest = ctx.req
        out, c = d.output, d.choice
        text, logprobs = d.text, None
        if req.logprobs is not None:
            end = len(c.token_ids)
            logprobs = self._logprobs(c.token_ids[d.token_start:end], (c.logprobs or [])[d.token_start:end])
        if req.echo and d.first:
            prompt_text = out.prompt if out.prompt is not None else self.tokenizer.decode(out.prompt_token_ids)
            text = prompt_text + text
            if logprobs is not None:
                echoed = self._logprobs(out.prompt_token_ids, out.prompt_logprobs or [None])
                logprobs = _concat(echoed, logprobs)
        return {"index": d.prompt_index * req.n + c.index, "text": text, "logprobs": logprobs,
                "finish_reason": d.finish_reason}

    def _logprobs(self, token_ids: list[int], entries: list[dict[int, Logprob] | None]) -> dict:
        """OpenAI's completions logprobs: tokens, token_logprobs, top_logprobs, text_offset."""
        tokens, token_lps, tops, offsets, offset = [], [], [], [], 0
        for i, tid in enumerate(token_ids):
            entry = entries[i] if i < len(entries) else None
            chosen = entry.get(tid) if entry else None
            token = chosen.decoded_token if chosen and chosen.decoded_token is not None \
                else self.tokenizer.decode([tid])
            tokens.append(token)
            offsets.append(offset)
            offset += len(token)
            token_lps.append(finite(chosen.logprob) if chosen else None)
            tops.append(_top_dict(entry) if entry else None)
        return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}


def _top_dict(entry: dict[int, Logprob]) -> dict[str, float]:
    top: dict[str, float] = {}
    for lp in sorted(entry.values(), key=lambda x: -x.logprob):
        top.setdefault(lp.decoded_token or "", finite(lp.logprob))
    return top


def _concat(a: dict, b: dict) -> dict:
    shift = (a["text_offset"][-1] + len(a["tokens"][-1])) if a["tokens"] else 0
    return {"tokens": a["tokens"] + b["tokens"], "token_logprobs": a["token_logprobs"] + b["token_logprobs"],
            "top_logprobs": a["top_logprobs"] + b["top_logprobs"],
            "text_offset": a["text_offset"] + [o + shift for o in b["text_offset"]]}
