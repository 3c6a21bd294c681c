"""POST /v1/responses: OpenAI's Responses API over the chat machinery, as vLLM serves it: output items (reasoning,
message, function calls) built by one state machine that a stream's `response.*` events and a whole answer share, so
the two agree; finished responses kept in a bounded store for `previous_response_id` and GET (responses_store.py)."""
from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Any

from tally.errors import InvalidRequestError, ModelNotFoundError, echo
from tally.outputs import RequestOutput
from tally.sampling_params import SamplingParams, StructuredOutputsParams
from tally.server.chat import ChatCompletions, render_chat
from tally.server.lifecycle import Ctx, ServerState
from tally.server.protocol import ChatMessage, SamplingFields, refuse_unsupported
from tally.server.responses_input import (
    HARMLESS_FIELDS,
    ResponsesRequest,
    chat_tool_choice,
    chat_tools,
    input_turns,
)
from tally.server.responses_store import ResponsesStore, StoredResponse
from tally.server.streaming import Framing, deltas
from tally.server.tools import ToolMode, forced_output, stream_delta, tool_mode


def _stream_error(err) -> dict:
    return {"type": "error", "code": err.error_type, "message": err.message, "param": err.param}


RESPONSES = Framing(named=True, done=b"", stream_error=_stream_error)


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


class Responses:
    path = "/v1/responses"
    id_prefix = "resp"
    framing = RESPONSES

    def __init__(self, chat: ChatCompletions, store: ResponsesStore) -> None:
        self.chat = chat  # its tokenizer, templates, tool-call parser, reasoning parser and logprobs
        self.store = store
        self.reasoning = chat.reasoning_parser

    def parse(self, body: dict) -> ResponsesRequest:
        refuse_unsupported(body, ResponsesRequest, HARMLESS_FIELDS)
        return ResponsesRequest.model_validate(body)

    def _mode(self, req: ResponsesRequest) -> ToolMode | None:
        return tool_mode(chat_tools(req.tools), chat_tool_choice(req.tool_choice), self.chat.tool_call_parser)

    def engine_requests(self, req: ResponsesRequest, state: ServerState) -> list[tuple[Any, SamplingParams]]:
        if req.reasoning is not None and (self.reasoning is None or any(v is not None for v in req.reasoning.values())):
            raise InvalidRequestError("reasoning: this server sets no reasoning effort or summary (a model thinks as "
                                      "its chat template and --reasoning-parser have it); omit reasoning",
                                      param="reasoning")
        mode = self._mode(req)
        if mode is not None and mode.choice == "auto" and not req.parallel_tool_calls:
            raise InvalidRequestError('parallel_tool_calls false needs tool_choice "required" or a named function '
                                      '(with "auto" the model writes as many calls as it likes)',
                                      param="parallel_tool_calls")
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        params = SamplingFields(temperature=req.temperature, top_p=req.top_p).to_sampling_params(
            req.max_output_tokens, logprobs, defaults=state.sampling_defaults)
        constraint = req.output_format()
        if mode is not None and mode.forced:
            if constraint is not None:
                raise InvalidRequestError("a forced tool_choice constrains the output itself; drop text.format",
                                          param="text.format")
            constraint = forced_output(mode, chat_tools(req.tools))
            if not req.parallel_tool_calls and mode.choice == "required":
                constraint = StructuredOutputsParams(json={**constraint.json, "maxItems": 1})
        if constraint is not None and self.reasoning is not None:  # the answer is constrained, not the thinking
            constraint = self.chat.after_thinking(constraint, "tool_choice" if mode is not None and mode.forced
                                                  else "text.format")
        params = dataclasses.replace(params, structured_outputs=constraint)
        earlier = []
        if req.previous_response_id is not None:
            entry = self.store.get(req.previous_response_id)
            if entry is None:
                raise InvalidRequestError(f"previous_response_id {echo(req.previous_response_id)} is not in this "
                                          f"server's store (it holds the last {self.store.max_entries} stored "
                                          "responses, in memory, until a restart); send the whole conversation as "
                                          "input instead", param="previous_response_id")
            earlier = entry.conversation
        req._conversation = [*earlier, *input_turns(req.input)]
        system = [] if req.instructions is None else [ChatMessage(role="system", content=req.instructions)]
        prompt = render_chat(self.chat.tokenizer, [*system, *req._conversation], tools=chat_tools(req.tools),
                             chat_template=self.chat.chat_template, renderer=self.chat.renderer,
                             max_prompt_tokens=state.max_model_len)
        return [(prompt, params)]

    # -- responses -----------------------------------------------------------------------------
    def response(self, ctx: Ctx, outputs: list[RequestOutput | None], state: ServerState) -> dict:
        st = self._state(ctx)
        self._advance(ctx, st, {}, outputs)
        self._close(st)
        return self._finished(ctx, st, outputs)

    def opening(self, ctx: Ctx) -> list[dict]:
        st = ctx.handler_state
        st.update(self._state(ctx))
        shell = self._object(ctx, st, "in_progress", [None])
        return [_event(st, "response.created", response=shell), _event(st, "response.in_progress", response=shell)]

    def events(self, ctx: Ctx, outputs: list[RequestOutput | None]) -> list[dict]:
        return self._advance(ctx, ctx.handler_state, ctx.sent, outputs)

    def closing(self, ctx: Ctx, outputs: list[RequestOutput | None]) -> list[dict]:
        st = ctx.handler_state
        events = self._close(st)
        final = self._finished(ctx, st, outputs)
        kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
        return [*events, _event(st, kind, response=final)]

    # -- the output items, as they grow ----------------------------------------------------------
    def _state(self, ctx: Ctx) -> dict:
        return {"seq": 0, "items": [], "open": None, "calls": {}, "answer": "", "called": False, "logprobs": [],
                "reasoner": self.reasoning.streamer() if self.reasoning else None, "mode": self._mode(ctx.req)}

    def _advance(self, ctx: Ctx, st: dict, sent: dict, outputs: list[RequestOutput | None]) -> list[dict]:
        events: list[dict] = []
        for d in deltas(sent, outputs):
            final = d.finish_reason is not None
            piece = d.text
            if st["reasoner"] is not None:
                thought, piece = st["reasoner"].feed(d.text)
                if final:
                    more_thought, more = st["reasoner"].finish()
                    thought, piece = thought + more_thought, piece + more
                if thought:
                    events += self._reasoning(st, thought)
            if ctx.req.logprobs:
                st["logprobs"] += (self.chat._logprobs(d, ctx.req.top_logprobs or 0) or {}).get("content", [])
            before = st["answer"]
            st["answer"] += piece
            mode: ToolMode | None = st["mode"]
            if mode is None:
                content, calls = piece, []
            else:
                content, calls, called = stream_delta(mode, before, st["answer"], final)
                st["called"] = st["called"] or called
            if content:
                events += self._text(st, content)
            for call in calls:
                events += self._call(st, call)
        return events

    def _open(self, st: dict, item: dict) -> list[dict]:
        events = self._close(st)
        st["items"].append(item)
        st["open"] = len(st["items"]) - 1
        events.append(_event(st, "response.output_item.added", output_index=st["open"], item=dict(item)))
        if item["type"] == "message":
            events.append(_event(st, "response.content_part.added", item_id=item["id"], output_index=st["open"],
                                 content_index=0, part=_part("")))
        return events

    def _reasoning(self, st: dict, text: str) -> list[dict]:
        events = [] if self._open_type(st) == "reasoning" else self._open(st, {
            "type": "reasoning", "id": _item_id("rs"), "summary": [], "content": [], "status": "in_progress"})
        item = st["items"][st["open"]]
        item["text"] = item.get("text", "") + text
        return [*events, _event(st, "response.reasoning_text.delta", item_id=item["id"], output_index=st["open"],
                                content_index=0, delta=text)]

    def _text(self, st: dict, text: str) -> list[dict]:
        events = [] if self._open_type(st) == "message" else self._open(st, {
            "type": "message", "id": _item_id("msg"), "status": "in_progress", "role": "assistant", "content": []})
        item = st["items"][st["open"]]
        item["text"] = item.get("text", "") + text
        logprobs, st["logprobs"] = st["logprobs"], []
        item["logprobs"] = item.get("logprobs", []) + logprobs
        return [*events, _event(st, "response.output_text.delta", item_id=item["id"], output_index=st["open"],
                                content_index=0, delta=text, logprobs=logprobs)]

    def _call(self, st: dict, call: dict) -> list[dict]:
        function, events = call.get("function", {}), []
        if "name" in function:
            events = self._open(st, {"type": "function_call", "id": _item_id("fc"), "call_id": call.get("id"),
                                     "name": function["name"], "arguments": "", "status": "in_progress"})
            st["calls"][call["index"]] = st["open"]
        if function.get("arguments"):
            at = st["calls"][call["index"]]
            item = st["items"][at]
            item["arguments"] += function["arguments"]
            events.append(_event(st, "response.function_call_arguments.delta", item_id=item["id"], output_index=at,
                                 delta=function["arguments"]))
        return events

    def _open_type(self, st: dict) -> str | None:
        return None if st["open"] is None else st["items"][st["open"]]["type"]

    def _close(self, st: dict) -> list[dict]:
        """Closes the open item: its `.done` events, its final shape in `items`."""
        at = st["open"]
        if at is None:
            return []
        st["open"] = None
        item = st["items"][at]
        events = []
        if item["type"] == "message":
            text, logprobs = item.pop("text"), item.pop("logprobs")
            item["content"] = [_part(text, logprobs)]
            events += [_event(st, "response.output_text.done", item_id=item["id"], output_index=at, content_index=0,
                              text=text, logprobs=logprobs),
                       _event(st, "response.content_part.done", item_id=item["id"], output_index=at, content_index=0,
                              part=item["content"][0])]
        elif item["type"] == "reasoning":
            text = item.pop("text")
            item["content"] = [{"type": "reasoning_text", "text": text}]
            events.append(_event(st, "response.reasoning_text.done", item_id=item["id"], output_index=at,
                                 content_index=0, text=text))
        else:
            events.append(_event(st, "response.function_call_arguments.done", item_id=item["id"], output_index=at,
                                 name=item["name"], arguments=item["arguments"]))
        item["status"] = "completed"
        return [*events, _event(st, "response.output_item.done", output_index=at, item=item)]

    # -- the response object ---------------------------------------------------------------------
    def _finished(self, ctx: Ctx, st: dict, outputs: list[RequestOutput | None]) -> dict:
        done = [o for o in outputs if o is not None]
        length = any(c.finish_reason == "length" for o in done for c in o.outputs)
        status = "cancelled" if ctx.cancelled else "incomplete" if length and not st["called"] else "completed"
        obj = self._object(ctx, st, status, outputs)
        req: ResponsesRequest = ctx.req
        if req.store:
            answer = next((i["content"][0]["text"] for i in st["items"] if i["type"] == "message"), "")
            calls = [{"id": i["call_id"], "type": "function",
                      "function": {"name": i["name"], "arguments": i["arguments"]}}
                     for i in st["items"] if i["type"] == "function_call"]
            turn = ChatMessage(role="assistant", content=answer, tool_calls=calls or None)
            self.store.put(StoredResponse(obj, [*req._conversation, turn]))
        return obj

    def _object(self, ctx: Ctx, st: dict, status: str, outputs: list[RequestOutput | None]) -> dict:
        req: ResponsesRequest = ctx.req
        done = [o for o in outputs if o is not None]
        prompt = sum(len(o.prompt_token_ids) for o in done)
        output = sum(len(c.token_ids) for o in done for c in o.outputs)
        return {
            "id": ctx.request_id, "object": "response", "created_at": ctx.created_s, "status": status,
            "completed_at": int(time.time()) if status == "completed" else None,
            "model": ctx.model, "output": [dict(i) for i in st["items"]] if status != "in_progress" else [],
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "error": None, "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "temperature": req.temperature, "top_p": req.top_p, "top_logprobs": req.top_logprobs,
            "tools": req.tools or [], "tool_choice": req.tool_choice or "auto",
            "parallel_tool_calls": req.parallel_tool_calls, "previous_response_id": req.previous_response_id,
            "store": req.store, "background": False, "truncation": "disabled", "reasoning": req.reasoning,
            "text": req.text or {"format": {"type": "text"}}, "metadata": {},
            "usage": None if status == "in_progress" else {
                "input_tokens": prompt, "output_tokens": output, "total_tokens": prompt + output,
                "input_tokens_details": {"cached_tokens": sum(o.num_cached_tokens for o in done)},
                "output_tokens_details": {"reasoning_tokens": 0}},
        }

    # -- GET and cancel --------------------------------------------------------------------------
    def get(self, response_id: str, state: ServerState) -> dict:
        if response_id in state.inflight:
            return {"id": response_id, "object": "response", "status": "in_progress", "output": []}
        entry = self.store.get(response_id)
        if entry is None:
            raise ModelNotFoundError(f"response {echo(response_id)} is not in this server's store (stored responses "
                                     f"are kept in memory, the last {self.store.max_entries}, until a restart; one "
                                     "sent with store: false is not kept)", param="response_id")
        return entry.response


def _part(text: str, logprobs: list | None = None) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def _event(st: dict, kind: str, **fields: Any) -> dict:
    st["seq"] += 1
    return {"type": kind, "sequence_number": st["seq"] - 1, **fields}
