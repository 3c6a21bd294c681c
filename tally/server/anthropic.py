"""Anthropic's Messages API as the chat machinery reads it: the request body, its content blocks turned into chat
turns and OpenAI-shaped tools, and Anthropic's error shape. Every field is implemented or refused with a 400 naming
it; `cache_control` is accepted and does nothing, because the prefix cache already reuses any prompt prefix seen."""
from __future__ import annotations

import json
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from tally.errors import InvalidRequestError, TallyError, echo
from tally.server.protocol import ChatMessage

# Accepted and unused: they describe the caller (metadata.user_id, service_tier) or ask for caching the prefix
# cache does anyway (cache_control, top-level or on any block, tool or system part).
HARMLESS_FIELDS = frozenset({"metadata", "service_tier", "cache_control"})
ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               429: "rate_limit_error", 503: "overloaded_error"}
# The keys each block type may carry; anything else in a block is refused by name.
BLOCK_KEYS = {"text": {"text", "citations"}, "tool_use": {"id", "name", "input"},
              "tool_result": {"tool_use_id", "content", "is_error"}, "thinking": {"thinking", "signature"},
              "redacted_thinking": {"data"}}
TOOL_KEYS = {"name", "description", "input_schema", "type"}


class MessagesRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # refuse_unsupported has named any field not here

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = None
    top_k: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None
    priority: ClassVar[int] = 0  # Anthropic's API has no priority field: every message takes the default

    def output_format(self) -> dict | None:
        """output_config.format's JSON schema, the one part of output_config implemented."""
        if self.output_config is None:
            return None
        _refuse_keys(self.output_config, {"format", "effort"}, "output_config")
        if self.output_config.get("effort") is not None:
            raise InvalidRequestError("output_config.effort: not supported by this server; omit it",
                                      param="output_config.effort")
        fmt = self.output_config.get("format")
        if fmt is None:
            return None
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
            raise InvalidRequestError('output_config.format must be {"type": "json_schema", "schema": {...}}',
                                      param="output_config.format")
        return fmt["schema"]


class CountTokensRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None


def anthropic_error(err: TallyError) -> dict:
    """Anthropic's error body, also the data of a stream's `error` event."""
    kind = ERROR_TYPES.get(err.http_status, "invalid_request_error" if err.http_status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": err.message}}


def chat_messages(system: str | list[dict] | None, messages: list[dict]) -> list[ChatMessage]:
    """The conversation as chat turns: the system prompt first; a user message's tool results each a tool turn, in
    the order given; an assistant message's tool_use blocks its tool calls. Earlier turns' thinking is dropped, as
    reasoning models' chat templates drop it."""
    turns = [] if system is None else [ChatMessage(role="system", content=_system_text(system))]
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or set(m) - {"role", "content"}:
            raise InvalidRequestError(f'{where} must be {{"role": ..., "content": ...}}, got keys '
                                      f"{echo(sorted(m) if isinstance(m, dict) else m)}", param=where)
        role = m.get("role")
        if role not in ("user", "assistant"):
            raise InvalidRequestError(f'{where}.role must be "user" or "assistant" (the system prompt goes in '
                                      f'`system`), got {echo(role)}', param=f"{where}.role")
        turns += _turns(role, _blocks(m.get("content"), f"{where}.content"), where)
    return turns


def openai_tools(tools: list[dict] | None) -> list[dict] | None:
    """Anthropic's custom tools in OpenAI's form, which chat templates and tally/server/tools.py read."""
    if not tools:
        return None
    out = []
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(t, dict):
            raise InvalidRequestError(f"{where} must be an object", param=where)
        if t.get("type", "custom") != "custom":
            raise InvalidRequestError(f"{where}.type {echo(t.get('type'))}: server tools are not supported; send "
                                      "custom tools (name, description, input_schema)", param=f"{where}.type")
        _refuse_keys(t, TOOL_KEYS, where)
        if not isinstance(t.get("name"), str) or not isinstance(t.get("input_schema"), dict):
            raise InvalidRequestError(f"{where} needs a name and an input_schema object", param=where)
        function = {"name": t["name"], "parameters": t["input_schema"]}
        if t.get("description") is not None:
            function["description"] = t["description"]
        out.append({"type": "function", "function": function})
    return out


def openai_tool_choice(choice: dict | None, has_tools: bool) -> str | dict | None:
    """tool_choice as tally/server/tools.py reads it: auto, any (OpenAI's "required"), tool (a named function),
    none. disable_parallel_tool_use holds for "tool" (one call by construction) and "any" (see `single_call`)."""
    if choice is None:
        return "auto" if has_tools else None
    _refuse_keys(choice, {"type", "name", "disable_parallel_tool_use"}, "tool_choice")
    kind = choice.get("type")
    if choice.get("disable_parallel_tool_use") and kind == "auto":
        raise InvalidRequestError('tool_choice.disable_parallel_tool_use: not supported with "auto" (the model '
                                  'writes as many calls as it likes); send {"type": "any", '
                                  '"disable_parallel_tool_use": true} to force exactly one call',
                                  param="tool_choice.disable_parallel_tool_use")
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise InvalidRequestError('tool_choice {"type": "tool"} needs the tool\'s "name"', param="tool_choice.name")
        return {"type": "function", "function": {"name": choice["name"]}}
    mapped = {"auto": "auto", "any": "required", "none": "none"}.get(kind)
    if mapped is None:
        raise InvalidRequestError(f'tool_choice.type must be "auto", "any", "tool" or "none", got {echo(kind)}',
                                  param="tool_choice.type")
    return mapped


def single_call(choice: dict | None) -> bool:
    return bool(choice and choice.get("type") == "any" and choice.get("disable_parallel_tool_use"))


def check_thinking(thinking: dict | None, reasoning: bool, max_tokens: int | None) -> None:
    """`thinking` enabled needs a server whose --reasoning-parser splits the model's thinking out; disabled is always
    fine. `budget_tokens` is checked as Anthropic checks it; max_tokens bounds thinking and answer together."""
    if thinking is None or thinking.get("type") == "disabled":
        return
    if thinking.get("type") != "enabled":
        raise InvalidRequestError('thinking.type must be "enabled" or "disabled"', param="thinking.type")
    if not reasoning:
        raise InvalidRequestError("thinking: this server splits no thinking out of the model's text; start it with "
                                  "--reasoning-parser, or omit thinking", param="thinking")
    _refuse_keys(thinking, {"type", "budget_tokens"}, "thinking")
    budget = thinking.get("budget_tokens")
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1024:
        raise InvalidRequestError("thinking.budget_tokens must be an integer of at least 1024",
                                  param="thinking.budget_tokens")
    if max_tokens is not None and budget >= max_tokens:
        raise InvalidRequestError(f"thinking.budget_tokens ({budget}) must be less than max_tokens ({max_tokens})",
                                  param="thinking.budget_tokens")


def _system_text(system: str | list[dict]) -> str:
    if isinstance(system, str):
        return system
    blocks = _blocks(system, "system")
    wrong = [b["type"] for b in blocks if b["type"] != "text"]
    if wrong:
        raise InvalidRequestError(f"system holds {wrong[0]} blocks; the system prompt is text", param="system")
    return "".join(b["text"] for b in blocks)


def _blocks(content: Any, where: str) -> list[dict]:
    """Content as checked blocks: a string is one text block; an unknown type or key is a 400 naming it."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise InvalidRequestError(f"{where} must be a string or a list of content blocks", param=where)
    for j, b in enumerate(content):
        at = f"{where}[{j}]"
        kind = b.get("type") if isinstance(b, dict) else None
        if kind not in BLOCK_KEYS:
            raise InvalidRequestError(f"{at}.type {echo(kind)}: not supported by this server (it reads text, "
                                      "tool_use, tool_result and thinking blocks; no images or documents)",
                                      param=f"{at}.type")
        _refuse_keys(b, BLOCK_KEYS[kind] | {"type"}, at)
        if kind == "text" and (not isinstance(b.get("text"), str) or b.get("citations")):
            raise InvalidRequestError(f"{at} must be {{\"type\": \"text\", \"text\": \"...\"}} (citations are not "
                                      "supported)", param=at)
    return content


def _turns(role: str, blocks: list[dict], where: str) -> list[ChatMessage]:
    if role == "assistant":
        misplaced = [b["type"] for b in blocks if b["type"] == "tool_result"]
        text = "".join(b["text"] for b in blocks if b["type"] == "text")
        calls = [_call(b, f"{where}.content[{j}]") for j, b in enumerate(blocks) if b["type"] == "tool_use"]
        if misplaced:
            raise InvalidRequestError(f"{where}: tool_result blocks belong in a user message", param=where)
        return [ChatMessage(role="assistant", content=text, tool_calls=calls or None)]
    turns: list[ChatMessage] = []
    text: list[str] = []
    for j, b in enumerate(blocks):
        if b["type"] == "tool_result":
            if text:
                turns.append(ChatMessage(role="user", content="".join(text)))
                text = []
            turns.append(_result(b, f"{where}.content[{j}]"))
        elif b["type"] == "text":
            text.append(b["text"])
        else:
            raise InvalidRequestError(f"{where}.content[{j}]: {b['type']} blocks belong in an assistant message",
                                      param=f"{where}.content[{j}].type")
    if text or not turns:
        turns.append(ChatMessage(role="user", content="".join(text)))
    return turns


def _call(block: dict, where: str) -> dict:
    if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str) or \
            not isinstance(block.get("input"), dict):
        raise InvalidRequestError(f"{where} needs an id, a name and an input object", param=where)
    return {"id": block["id"], "type": "function",
            "function": {"name": block["name"], "arguments": json.dumps(block["input"], ensure_ascii=False)}}


def _result(block: dict, where: str) -> ChatMessage:
    """A tool's answer; one that failed (is_error) reaches the model marked as an error."""
    if not isinstance(block.get("tool_use_id"), str):
        raise InvalidRequestError(f"{where} needs the tool_use_id it answers", param=f"{where}.tool_use_id")
    content = block.get("content", "")
    if not isinstance(content, str):
        parts = _blocks(content, f"{where}.content")
        if any(p["type"] != "text" for p in parts):
            raise InvalidRequestError(f"{where}.content: a tool result holds text blocks", param=f"{where}.content")
        content = "".join(p["text"] for p in parts)
    if block.get("is_error"):
        content = f"Error: {content}"
    return ChatMessage(role="tool", content=content, tool_call_id=block["tool_use_id"])


def _refuse_keys(obj: dict, known: set[str], where: str) -> None:
    unknown = sorted(set(obj) - known - {"cache_control"})
    if unknown:
        raise InvalidRequestError(f"{where}.{unknown[0]}: not supported by this server; omit it",
                                  param=f"{where}.{unknown[0]}")
