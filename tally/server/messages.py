"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API over the chat machinery (the chat
template, tool calls of tally/server/tools.py, the thinking split of --reasoning-parser), with its content blocks,
stop reasons and named stream events (message_start, content_block_start/delta/stop, message_delta, message_stop)."""
from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Any

from tally.errors import InvalidRequestError
from tally.outputs import CompletionOutput, RequestOutput
from tally.sampling_params import SamplingParams, StructuredOutputsParams
from tally.server.anthropic import (
    HARMLESS_FIELDS,
    CountTokensRequest,
    MessagesRequest,
    anthropic_error,
    chat_messages,
    check_thinking,
    openai_tool_choice,
    openai_tools,
    single_call,
)
from tally.server.chat import ChatCompletions, render_chat, split_delta
from tally.server.lifecycle import Ctx, ServerState
from tally.server.protocol import SamplingFields, refuse_unsupported
from tally.server.reasoning import ReasoningParser
from tally.server.streaming import Framing, deltas
from tally.server.tools import ToolMode, forced_output, stream_delta, tool_mode

ANTHROPIC = Framing(named=True, done=b"", error_body=anthropic_error, stream_error=anthropic_error)


def tool_use_id() -> str:
    return "toolu_" + uuid.uuid4().hex[:24]


class Messages:
    path = "/v1/messages"
    id_prefix = "msg"
    framing = ANTHROPIC

    def __init__(self, chat: ChatCompletions) -> None:
        self.chat = chat  # its tokenizer, templates, tool-call parser and reasoning parser

    def parse(self, body: dict) -> MessagesRequest:
        refuse_unsupported(body, MessagesRequest, HARMLESS_FIELDS)
        return MessagesRequest.model_validate(body)

    def _mode(self, req: MessagesRequest) -> ToolMode | None:
        tools = openai_tools(req.tools)
        return tool_mode(tools, openai_tool_choice(req.tool_choice, bool(tools)), self.chat.tool_call_parser)

    def _parser(self, req: MessagesRequest) -> ReasoningParser | None:
        """The server's reasoning parser, unless the request turned thinking off."""
        return None if _thinking_off(req.thinking) else self.chat.reasoning_parser

    def prompt(self, req: MessagesRequest | CountTokensRequest, state: ServerState) -> dict:
        """The engine's prompt: the conversation through the chat template; a last assistant message is continued
        (Anthropic's prefill). Blocks while the template renders: call it off the event loop."""
        check_thinking(req.thinking, self.chat.reasoning_parser is not None, getattr(req, "max_tokens", None))
        turns = chat_messages(req.system, req.messages)
        prefill = turns[-1].role == "assistant"
        # Thinking asked on or off reaches the template as Qwen3's switch; unsaid, the template's default holds.
        switch = None if req.thinking is None else {"enable_thinking": not _thinking_off(req.thinking)}
        return render_chat(self.chat.tokenizer, turns, not prefill, tools=openai_tools(req.tools),
                           chat_template=self.chat.chat_template, template_kwargs=switch,
                           continue_final_message=prefill, renderer=self.chat.renderer,
                           max_prompt_tokens=state.max_model_len)

    def count_tokens(self, body: dict, state: ServerState) -> dict:
        refuse_unsupported(body, CountTokensRequest, HARMLESS_FIELDS)
        req = CountTokensRequest.model_validate(body)
        state.check_model(req.model)
        tools = openai_tools(req.tools)
        openai_tool_choice(req.tool_choice, bool(tools))
        return {"input_tokens": len(self.prompt(req, state)["prompt_token_ids"])}

    def engine_requests(self, req: MessagesRequest, state: ServerState) -> list[tuple[Any, SamplingParams]]:
        mode = self._mode(req)
        try:
            params = SamplingFields(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
                                    stop=req.stop_sequences).to_sampling_params(req.max_tokens, None,
                                                                                defaults=state.sampling_defaults)
        except InvalidRequestError as e:
            if e.param != "stop":
                raise
            raise InvalidRequestError(f"stop_sequences: {e.message}", param="stop_sequences") from None
        schema = req.output_format()
        if schema is not None:
            params = dataclasses.replace(params, structured_outputs=StructuredOutputsParams(json=schema))
        if mode is not None and mode.forced:
            if schema is not None:
                raise InvalidRequestError("a forced tool_choice constrains the output itself; drop "
                                          "output_config.format", param="output_config.format")
            constraint = forced_output(mode, openai_tools(req.tools))
            if single_call(req.tool_choice):
                constraint = StructuredOutputsParams(json={**constraint.json, "maxItems": 1})
            params = dataclasses.replace(params, structured_outputs=constraint)
        if params.structured_outputs is not None and self._parser(req) is not None:
            field = "output_config.format" if schema is not None else "tool_choice"
            params = dataclasses.replace(params, structured_outputs=self.chat.after_thinking(params.structured_outputs,
                                                                                            field))
        return [(self.prompt(req, state), params)]

    # -- responses -----------------------------------------------------------------------------
    def response(self, ctx: Ctx, outputs: list[RequestOutput], state: ServerState) -> dict:
        req: MessagesRequest = ctx.req
        out = outputs[0]
        c = out.outputs[0]
        mode, parser = self._mode(req), self._parser(req)
        thinking, answer = parser.split(c.text) if parser is not None else (None, c.text)
        text, calls = mode.parse(answer) if mode is not None else (answer, [])
        content: list[dict] = [{"type": "thinking", "thinking": thinking, "signature": ""}] if thinking else []
        content += [{"type": "text", "text": text}] if text else []
        content += [{"type": "tool_use", "id": tool_use_id(), "name": call.name, "input": _input(call.arguments)}
                    for call in calls]
        reason, sequence = _stop_reason(c, bool(calls), req.stop_sequences)
        return {"id": ctx.request_id, "type": "message", "role": "assistant", "model": ctx.model, "content": content,
                "stop_reason": reason, "stop_sequence": sequence,
                "usage": {"input_tokens": len(out.prompt_token_ids), "output_tokens": len(c.token_ids)}}

    def opening(self, ctx: Ctx) -> list[dict]:
        ctx.handler_state.update(open=None, kind=None, next=0, calls={}, called=False)
        message = {"id": ctx.request_id, "type": "message", "role": "assistant", "model": ctx.model, "content": [],
                   "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": len(ctx.prompts[0]["prompt_token_ids"]), "output_tokens": 0}}
        return [{"type": "message_start", "message": message}, {"type": "ping"}]

    def events(self, ctx: Ctx, outputs: list[RequestOutput | None]) -> list[dict]:
        """Thinking opens a thinking block, text a text block; a tool call's name opens a tool_use block, whose input
        then streams as input_json_delta pieces (tally/server/tools.py:stream_delta reads the calls out of the
        growing answer)."""
        st, mode, parser, out = ctx.handler_state, self._mode(ctx.req), self._parser(ctx.req), []
        for d in deltas(ctx.sent, outputs):
            thinking, answer, before = split_delta(ctx, d, parser)
            if thinking:
                out += _thinking(st, thinking)
            if mode is None:
                if answer:
                    out += _text(st, answer)
                continue
            content, calls, called = stream_delta(mode, before, before + answer, d.finish_reason is not None)
            if content:
                out += _text(st, content)
            for call in calls:
                function = call.get("function", {})
                if "name" in function:
                    out += _open(st, {"type": "tool_use", "id": tool_use_id(), "name": function["name"], "input": {}})
                    st["calls"][call["index"]] = st["open"]
                if function.get("arguments"):
                    out.append({"type": "content_block_delta", "index": st["calls"][call["index"]],
                                "delta": {"type": "input_json_delta", "partial_json": function["arguments"]}})
            st["called"] = st["called"] or called
        return out

    def closing(self, ctx: Ctx, outputs: list[RequestOutput | None]) -> list[dict]:
        st, out = ctx.handler_state, []
        if st["open"] is not None:
            out.append({"type": "content_block_stop", "index": st["open"]})
        final = outputs[0]
        c = final.outputs[0] if final is not None else None
        reason, sequence = _stop_reason(c, st["called"], ctx.req.stop_sequences) if c else ("end_turn", None)
        out.append({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                    "usage": {"output_tokens": len(c.token_ids) if c else 0}})
        out.append({"type": "message_stop"})
        return out


def _open(st: dict, block: dict) -> list[dict]:
    """Closes the open block, opens `block` as the next index."""
    out = [] if st["open"] is None else [{"type": "content_block_stop", "index": st["open"]}]
    st.update(open=st["next"], kind=block["type"], next=st["next"] + 1)
    return [*out, {"type": "content_block_start", "index": st["open"], "content_block": block}]


def _thinking(st: dict, text: str) -> list[dict]:
    # No signature: nothing here verifies a thinking block sent back (earlier turns' thinking is dropped).
    out = [] if st["kind"] == "thinking" else _open(st, {"type": "thinking", "thinking": "", "signature": ""})
    return [*out, {"type": "content_block_delta", "index": st["open"],
                   "delta": {"type": "thinking_delta", "thinking": text}}]


def _thinking_off(thinking: dict | None) -> bool:
    return thinking is not None and thinking.get("type") == "disabled"


def _text(st: dict, text: str) -> list[dict]:
    out = [] if st["kind"] == "text" else _open(st, {"type": "text", "text": ""})
    return [*out, {"type": "content_block_delta", "index": st["open"], "delta": {"type": "text_delta", "text": text}}]


def _stop_reason(c: CompletionOutput, called: bool, stop_sequences: list[str] | None) -> tuple[str, str | None]:
    """Anthropic's stop_reason and stop_sequence from how the choice ended."""
    if called:
        return "tool_use", None
    if c.finish_reason == "length":
        return "max_tokens", None
    if isinstance(c.stop_reason, str) and c.stop_reason in (stop_sequences or ()):
        return "stop_sequence", c.stop_reason
    return "end_turn", None


def _input(arguments: str) -> Any:
    """A call's arguments (JSON text) as the tool_use block's input object."""
    try:
        return json.loads(arguments)
    except ValueError:
        return {}
