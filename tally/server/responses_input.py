"""The Responses API's request as the chat machinery reads it: the body, input items turned into chat turns, function
tools and tool_choice in chat's form. Every field is implemented or refused with a 400 naming it."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from tally.errors import InvalidRequestError, echo
from tally.sampling_params import StructuredOutputsParams
from tally.server.protocol import ChatMessage

# Accepted and unused: they describe the caller, or ask for caching the prefix cache does anyway (prompt_cache_key).
HARMLESS_FIELDS = frozenset({"metadata", "user", "service_tier", "safety_identifier", "prompt_cache_key",
                             "stream_options"})
LOGPROBS_INCLUDE = "message.output_text.logprobs"
MESSAGE_KEYS = {"type", "role", "content", "id", "status"}
CALL_KEYS = {"type", "call_id", "name", "arguments", "id", "status"}
OUTPUT_KEYS = {"type", "call_id", "output", "id", "status"}
PART_KEYS = {"type", "text", "annotations", "logprobs"}


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # refuse_unsupported has named any field not here

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    include: list[str] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False
    priority: int = 0  # vLLM's: lower runs sooner, under --scheduling-policy priority
    background: Literal[False] = False  # no background mode: a response answers on its own connection
    truncation: Literal["disabled"] = "disabled"  # a prompt longer than the context is refused, never cut
    _conversation: list[ChatMessage] = PrivateAttr(default_factory=list)  # earlier turns and this input

    @property
    def logprobs(self) -> bool:
        extra = sorted(set(self.include or ()) - {LOGPROBS_INCLUDE})
        if extra:
            raise InvalidRequestError(f"include {echo(extra)}: not supported by this server; it includes "
                                      f"{LOGPROBS_INCLUDE!r} only", param="include")
        return LOGPROBS_INCLUDE in (self.include or ())

    def output_format(self) -> StructuredOutputsParams | None:
        """text.format: plain text, or JSON (an object, or to a schema) by constrained decoding."""
        if self.text is None:
            return None
        _refuse_keys(self.text, {"format", "verbosity"}, "text")
        if self.text.get("verbosity") is not None:
            raise InvalidRequestError("text.verbosity: not supported by this server; omit it", param="text.verbosity")
        fmt = self.text.get("format") or {"type": "text"}
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind == "text":
            return None
        if kind == "json_object":
            return StructuredOutputsParams(json_object=True)
        if kind == "json_schema" and isinstance(fmt.get("schema"), dict):
            return StructuredOutputsParams(json=fmt["schema"])
        raise InvalidRequestError('text.format must be {"type": "text"}, {"type": "json_object"} or {"type": '
                                  '"json_schema", "name": ..., "schema": {...}}', param="text.format")


def chat_tools(tools: list[dict] | None) -> list[dict] | None:
    """Function tools in chat's form; other tool types (web search, files, MCP, ...) are refused by name."""
    if not tools:
        return None
    out = []
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, dict) else t
            raise InvalidRequestError(f"{where}.type {echo(kind)}: only function tools are supported",
                                      param=f"{where}.type")
        _refuse_keys(t, {"type", "name", "description", "parameters", "strict"}, where)
        if not isinstance(t.get("name"), str):
            raise InvalidRequestError(f"{where} needs a name", param=f"{where}.name")
        function = {k: t[k] for k in ("name", "description", "parameters") if t.get(k) is not None}
        out.append({"type": "function", "function": function})
    return out


def chat_tool_choice(choice: str | dict | None) -> str | dict | None:
    if isinstance(choice, dict):
        _refuse_keys(choice, {"type", "name"}, "tool_choice")
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise InvalidRequestError('tool_choice must be "auto", "none", "required" or {"type": "function", '
                                      '"name": ...}', param="tool_choice")
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def input_turns(given: str | list[dict]) -> list[ChatMessage]:
    """Input items as chat turns: messages; function calls joined to the assistant turn before them; their outputs
    as tool turns. Reasoning items of earlier turns are dropped, as reasoning models' chat templates drop them."""
    if isinstance(given, str):
        return [ChatMessage(role="user", content=given)]
    turns: list[ChatMessage] = []
    for i, item in enumerate(given):
        where = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            _refuse_keys(item, MESSAGE_KEYS, where)
            turns.append(_message(item, where))
        elif kind == "function_call":
            _refuse_keys(item, CALL_KEYS, where)
            if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
                raise InvalidRequestError(f"{where} needs call_id, name and arguments (JSON text)", param=where)
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            if not (turns and turns[-1].role == "assistant"):
                turns.append(ChatMessage(role="assistant", content=""))
            turns[-1].tool_calls = [*(turns[-1].tool_calls or []), call]
        elif kind == "function_call_output":
            _refuse_keys(item, OUTPUT_KEYS, where)
            if not isinstance(item.get("call_id"), str) or not isinstance(item.get("output"), str):
                raise InvalidRequestError(f"{where} needs call_id and output (text)", param=where)
            turns.append(ChatMessage(role="tool", content=item["output"], tool_call_id=item["call_id"]))
        elif kind != "reasoning":
            raise InvalidRequestError(f"{where}.type {echo(kind)}: not supported by this server (it reads message, "
                                      "function_call, function_call_output and reasoning items)", param=f"{where}.type")
    if not turns:
        raise InvalidRequestError("input holds no message; send at least one", param="input")
    return turns


def _message(item: dict, where: str) -> ChatMessage:
    role, content = item.get("role"), item.get("content")
    if role not in ("user", "system", "developer", "assistant"):
        raise InvalidRequestError(f'{where}.role must be "user", "system", "developer" or "assistant", got '
                                  f"{echo(role)}", param=f"{where}.role")
    if isinstance(content, str):
        return ChatMessage(role=role, content=content)
    if not isinstance(content, list):
        raise InvalidRequestError(f"{where}.content must be text or a list of parts", param=f"{where}.content")
    texts = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text") or not isinstance(part.get("text"), str):
            raise InvalidRequestError(f"{at}.type {echo(kind)}: not supported by this server (it reads input_text "
                                      "and output_text parts; no images, files or audio)", param=f"{at}.type")
        _refuse_keys(part, PART_KEYS, at)
        texts.append(part["text"])
    return ChatMessage(role=role, content="".join(texts))


def _refuse_keys(obj: dict, known: set[str], where: str) -> None:
    unknown = sorted(set(obj) - known)
    if unknown:
        raise InvalidRequestError(f"{where}.{unknown[0]}: not supported by this server; omit it",
                                  param=f"{where}.{unknown[0]}")
