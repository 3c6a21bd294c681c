"""POST /v1/chat/completions: messages through the model's chat template, OpenAI's chat format back.
`response_format` constrains decoding (tally/engine/structured_output.py), so the answer is the JSON asked for;
`tools` and `tool_choice` become tool calls (tally/server/tools.py); with --reasoning-parser the thinking comes back
apart from the answer (tally/server/reasoning.py), and constraints and tool calls apply to the answer alone."""
from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from tally.errors import InvalidRequestError, echo
from tally.json_text import check_depth
from tally.models.chat_template import Renderer, chat_prompt, refuse_without_template
from tally.models.chat_template import render_chat as render_text
from tally.outputs import Logprob, RequestOutput
from tally.sampling_params import MAX_LOGPROBS, SamplingParams, StructuredOutputsParams
from tally.server.lifecycle import Ctx, OpenAIStream, ServerState, usage
from tally.server.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    finite,
    refuse_unsupported,
)
from tally.server.reasoning import ReasoningParser
from tally.server.streaming import Delta, deltas
from tally.server.tools import ToolMode, check_tools, forced_output, stream_delta, tool_mode

if TYPE_CHECKING:
    from tally.models.tokenizer import Tokenizer


def render_chat(tokenizer: Tokenizer, messages: list[ChatMessage], add_generation_prompt: bool = True,
                **render: Any) -> dict:
    """Chat messages → the engine's prompt (text and ids). `render`: tools, chat_template, template kwargs,
    continue_final_message, the renderer (tally/models/chat_template.py). Blocks while the template renders: call it
    off the event loop."""
    turns = [_turn(m, i) for i, m in enumerate(messages)]
    return chat_prompt(tokenizer, turns, without_template=refuse_without_template,
                       add_generation_prompt=add_generation_prompt, **render)


def chat_text(tokenizer: Tokenizer, messages: list[ChatMessage], add_generation_prompt: bool = True,
              **render: Any) -> str:
    """The rendered text alone, which POST /tokenize tokenizes itself; as render_chat otherwise."""
    turns = [_turn(m, i) for i, m in enumerate(messages)]
    return render_text(tokenizer, turns, without_template=refuse_without_template,
                       add_generation_prompt=add_generation_prompt, **render)


def _turn(m: ChatMessage, index: int) -> dict:
    """One message as chat templates read it."""
    turn: dict[str, Any] = {"role": m.role, "content": m.text()}
    if m.name:
        turn["name"] = m.name
    if m.tool_call_id:
        turn["tool_call_id"] = m.tool_call_id
    if m.reasoning_content is not None or m.reasoning is not None:  # a thinking model's earlier turn
        turn["reasoning_content"] = m.reasoning_content if m.reasoning_content is not None else m.reasoning
    if m.tool_calls:
        turn["tool_calls"] = [_tool_call(c, f"messages[{index}].tool_calls[{j}]") for j, c in enumerate(m.tool_calls)]
    return turn


def _tool_call(call: dict, where: str) -> dict:
    """An assistant turn's call as the API returned it, its arguments parsed to a dict where they are JSON (Hugging
    Face's convention for templates); a 400 naming the field where it is not the API's shape."""
    function = call.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise InvalidRequestError(f'{where}.function must be {{"name": "...", "arguments": "..."}}, got '
                                  f"{echo(function)}", param=f"{where}.function")
    args = function.get("arguments")
    if isinstance(args, str):
        check_depth(args, f"{where}.function.arguments", param=f"{where}.function.arguments")
        try:
            args = json.loads(args)
        except ValueError:
            pass  # text that is not JSON reaches the template as it is
    return {**call, "function": {**function, "arguments": args}}


class ChatCompletions(OpenAIStream):
    path = "/v1/chat/completions"
    id_prefix = "chatcmpl"
    chunk_object = "chat.completion.chunk"

    def __init__(self, tokenizer: Tokenizer, renderer: Renderer, tool_call_parser: str | None = None,
                 chat_template: str | None = None, request_renderer: Renderer | None = None,
                 reasoning_parser: ReasoningParser | None = None) -> None:
        self.tokenizer = tokenizer
        self.renderer = renderer  # the server's template workers
        self.tool_call_parser = tool_call_parser  # set with --enable-auto-tool-choice
        self.chat_template = chat_template  # --chat-template
        # --trust-request-chat-template: where a request's own chat_template renders, instead of the server's
        self.request_renderer = request_renderer
        self.reasoning_parser = reasoning_parser  # --reasoning-parser
        # the tags' token ids, which hold a constraint back while the model thinks (None: not one token)
        self._thinking_ids = (None if reasoning_parser is None else
                              (_single_token(tokenizer, reasoning_parser.start),
                               _single_token(tokenizer, reasoning_parser.end)))

    def _reasoning(self, req: ChatCompletionRequest) -> ReasoningParser | None:
        """The parser, unless the request turned thinking off in its template (Qwen3's enable_thinking, DeepSeek
        V3.1's thinking): then the whole text is the answer."""
        kwargs = req.chat_template_kwargs or {}
        if kwargs.get("enable_thinking") is False or kwargs.get("thinking") is False:
            return None
        return self.reasoning_parser

    def _tool_mode(self, req: ChatCompletionRequest) -> ToolMode | None:
        return tool_mode(req.tools, req.tool_choice, self.tool_call_parser)

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
        params = req.to_sampling_params(max_tokens, (req.top_logprobs or 0) if req.logprobs else None,
                                        defaults=state.sampling_defaults)
        if req.tools:
            check_tools(req.tools)
        mode = self._tool_mode(req)
        if mode is not None and mode.forced:
            if params.structured_outputs is not None:
                raise InvalidRequestError("a forced tool_choice constrains the output itself; drop the other "
                                          "constraint", param="tool_choice")
            params = dataclasses.replace(params, structured_outputs=forced_output(mode, req.tools))
        if params.structured_outputs is not None and self._reasoning(req) is not None:
            field = "tool_choice" if mode is not None and mode.forced else "response_format"
            params = dataclasses.replace(params, structured_outputs=self.after_thinking(params.structured_outputs,
                                                                                         field))
        if req.chat_template is not None and self.request_renderer is None:
            raise InvalidRequestError("chat_template: this server does not render a request's own chat template "
                                      "(a template is code); drop the field, or start the server with "
                                      "--trust-request-chat-template", param="chat_template")
        prompt = render_chat(self.tokenizer, req.messages, req.add_generation_prompt, tools=req.tools,
                             chat_template=req.chat_template or self.chat_template,
                             template_kwargs=req.chat_template_kwargs,
                             continue_final_message=req.continue_final_message,
                             renderer=self.renderer if req.chat_template is None else self.request_renderer,
                             max_prompt_tokens=state.max_model_len)
        return [(prompt, params)]

    def after_thinking(self, spec: StructuredOutputsParams, field: str) -> StructuredOutputsParams:
        """The constraint begins after the thinking's end tag, as vLLM's: the thinking is free text. Where the
        thinking must open with its start tag (qwen3), the constraint binds at once unless the model writes that tag
        first, so an answer given without thinking is constrained too."""
        parser, (start_id, end_id) = self.reasoning_parser, self._thinking_ids
        needed = [t for t, i in ((parser.end, end_id), (parser.start, start_id if not parser.implicit_start else 0))
                  if i is None]
        if needed:
            raise InvalidRequestError(
                f"structured outputs (response_format, a forced tool_choice) with --reasoning-parser {parser.name} "
                f"need its tag {needed[0]!r} to be one token of this model's vocabulary, and it is not; drop the "
                "constraint, or turn thinking off for this request (chat: chat_template_kwargs "
                '{"enable_thinking": false}; messages: thinking {"type": "disabled"})', param=field)
        return dataclasses.replace(spec, after_token_id=end_id,
                                   opener_token_id=None if parser.implicit_start else start_id)

    # -- responses -----------------------------------------------------------------------------
    def response(self, ctx: Ctx, outputs: list[RequestOutput], state: ServerState) -> dict:
        req: ChatCompletionRequest = ctx.req
        mode = self._tool_mode(req)
        parser = self._reasoning(req)
        choices = []
        for d in deltas({}, outputs):
            reasoning, answer = parser.split(d.text) if parser is not None else (None, d.text)
            content, calls = mode.parse(answer) if mode is not None else (_echoed(req) + answer, [])
            message: dict[str, Any] = {"role": "assistant",
                                       "content": None if reasoning is not None and not content else content}
            if self.reasoning_parser is not None:  # both names: clients read one or the other
                message["reasoning_content"] = message["reasoning"] = reasoning
            if calls:
                message["tool_calls"] = [c.as_openai() for c in calls]
            choices.append({"index": d.choice.index, "message": message,
                            "logprobs": self._logprobs(d, req.top_logprobs or 0),
                            "finish_reason": _finish_reason(mode, bool(calls), d.finish_reason)})
        return {"id": ctx.request_id, "object": "chat.completion", "created": ctx.created_s, "model": ctx.model,
                "choices": choices, "usage": usage(outputs)}

    def chunks(self, ctx: Ctx, outputs: list[RequestOutput | None]) -> list[dict]:
        mode = self._tool_mode(ctx.req)
        if mode is not None:
            return self._tool_chunks(ctx, outputs, mode)
        out = []
        for d in deltas(ctx.sent, outputs):
            logprobs = self._logprobs(d, ctx.req.top_logprobs or 0)
            reasoning, answer, _ = self._split(ctx, d)
            if not (answer or reasoning or d.first or d.finish_reason or logprobs):
                continue  # text still held back (a possible stop string or tag, a partial character)
            text = _echoed(ctx.req) + answer if d.first else answer
            delta: dict = {"role": "assistant"} if d.first else {}
            if text or (d.first and not reasoning):
                delta["content"] = text
            if reasoning:
                delta["reasoning_content"] = delta["reasoning"] = reasoning
            out.append({"id": ctx.request_id, "object": self.chunk_object, "created": ctx.created_s,
                        "model": ctx.model, "choices": [{"index": d.choice.index, "delta": delta,
                                                         "logprobs": logprobs,
                                                         "finish_reason": d.finish_reason}]})
        return out

    def _tool_chunks(self, ctx: Ctx, outputs: list[RequestOutput | None], mode: ToolMode) -> list[dict]:
        """Content streams as far as it cannot be the start of a call; a call's name as soon as it is complete, then
        its arguments piece by piece (tally/server/tools.py:stream_delta)."""
        out = []
        for d in deltas(ctx.sent, outputs):
            reasoning, answer, before = self._split(ctx, d)
            content, calls, called = stream_delta(mode, before, before + answer, d.finish_reason is not None)
            delta: dict[str, Any] = {"role": "assistant"} if d.first else {}
            if reasoning:
                delta["reasoning_content"] = delta["reasoning"] = reasoning
            if content:
                delta["content"] = content
            if calls:
                delta["tool_calls"] = calls
            if not delta and d.finish_reason is None:
                continue
            out.append({"id": ctx.request_id, "object": self.chunk_object, "created": ctx.created_s,
                        "model": ctx.model, "choices": [{"index": d.choice.index, "delta": delta, "logprobs": None,
                                                         "finish_reason": _finish_reason(mode, called,
                                                                                         d.finish_reason)}]})
        return out

    def _split(self, ctx: Ctx, d: Delta) -> tuple[str, str, str]:
        return split_delta(ctx, d, self._reasoning(ctx.req))

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


def _single_token(tokenizer: Tokenizer, tag: str) -> int | None:
    ids = tokenizer.encode(tag, add_special_tokens=False)
    return ids[0] if len(ids) == 1 else None


def _echoed(req: ChatCompletionRequest) -> str:
    last = req.messages[-1]
    return last.text() if req.echo and last.role == "assistant" else ""


def _finish_reason(mode: ToolMode | None, called: bool, reason: str | None) -> str | None:
    """OpenAI's: "tool_calls" when the model chose to call (auto, required); a named function's call is "stop"."""
    if reason is not None and called and mode is not None and mode.choice != "named":
        return "tool_calls"
    return reason


def _token(lp: Logprob) -> dict:
    text = lp.decoded_token or ""
    return {"token": text, "logprob": finite(lp.logprob), "bytes": list(text.encode())}


def split_delta(ctx: Ctx, d: Delta, parser: ReasoningParser | None) -> tuple[str, str, str]:
    """A chunk's text → (its thinking, its answer, the choice's answer before it); all answer without a parser. Each
    choice's thinking stream lives in ctx.reasoning."""
    if parser is None:
        text = d.choice.text
        return "", d.text, text[:len(text) - len(d.text)]
    key = (d.prompt_index, d.choice.index)
    stream, before = ctx.reasoning.get(key) or (parser.streamer(), "")
    reasoning, answer = stream.feed(d.text)
    if d.finish_reason is not None:
        more_reasoning, more_answer = stream.finish()
        reasoning, answer = reasoning + more_reasoning, answer + more_answer
    ctx.reasoning[key] = (stream, before + answer)
    return reasoning, answer, before
