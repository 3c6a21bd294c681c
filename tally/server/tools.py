"""Function calling: OpenAI's `tools` and `tool_choice`, with vLLM's flags and semantics.

- `tool_choice: "auto"` (the default when tools are given) lets the model decide; its text is parsed for calls
  by the parser `--tool-call-parser` names, which needs `--enable-auto-tool-choice` (as in vLLM; without it such a
  request is a 400 saying which flags to set). `hermes`: Hermes / Qwen2.5's `<tool_call>{"name": ..., "arguments":
  {...}}</tool_call>` blocks; `llama3_json`: Llama 3's bare `{"name": ..., "parameters": {...}}` objects, several
  joined by `;`.
- `"required"` and a named function constrain decoding (structured outputs), so the calls always parse: a named
  function's arguments against its parameters schema; `required`, a JSON array of at least one
  `{"name": ..., "parameters": ...}` for the tools given (vLLM's form). Neither needs a parser.
- `"none"`: the tools go to the chat template (so the model may know of them) and nothing is parsed.

Streaming: text before a call streams as content; a call's text is held back and sent as one `tool_calls` delta
(name and whole arguments) once the choice ends."""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from tally.errors import InvalidRequestError
from tally.sampling_params import StructuredOutputsParams

TOOL_CALL_PARSERS = ("hermes", "llama3_json")
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])

    def as_openai(self, index: int | None = None) -> dict:
        out = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return out if index is None else {"index": index, **out}


@dataclass(frozen=True)
class ToolMode:
    """How one chat request's output becomes tool calls."""

    choice: str  # "auto" | "required" | "named"
    parser: str | None  # auto only
    function: str | None = None  # named only

    @property
    def forced(self) -> bool:
        return self.choice != "auto"

    def visible(self, text: str) -> str:
        """The part of a choice's text that is content, not (the start of) a call: safe to stream now."""
        if self.forced:
            return ""
        if self.parser == "hermes":
            cut = text.find(HERMES_OPEN)
            if cut < 0:  # hold back a tail that may be the tag's beginning
                cut = next((len(text) - k for k in range(min(len(HERMES_OPEN) - 1, len(text)), 0, -1)
                            if HERMES_OPEN.startswith(text[-k:])), len(text))
            return text[:cut]
        return "" if text.lstrip().startswith("{") else text  # llama3_json: a call starts the output

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(content, calls) of a finished choice."""
        if self.choice == "named":
            return None, [ToolCall(self.function, _compact(text))]
        if self.choice == "required":
            return None, [ToolCall(c["name"], json.dumps(c.get("parameters", {}))) for c in _loads(text) or []]
        if self.parser == "hermes":
            calls = [_call(_loads(m.group(1))) for m in _HERMES_CALL.finditer(text)]
            if calls and all(calls):
                return text[:text.find(HERMES_OPEN)].strip() or None, calls
            return text, []
        stripped = text.strip()
        if stripped.startswith("{"):
            calls = [_call(_loads(part)) for part in stripped.split(";") if part.strip()]
            if calls and all(calls):
                return None, calls
        return text, []


def tool_mode(tools: list[dict] | None, tool_choice: str | dict | None, parser: str | None) -> ToolMode | None:
    """None when the request's output is plain content (no tools, or tool_choice "none")."""
    if not tools:
        if tool_choice not in (None, "none"):
            raise InvalidRequestError("tool_choice needs tools", param="tool_choice")
        return None
    names = {_function(t)["name"] for t in tools}
    if tool_choice is None or tool_choice == "auto":
        if parser is None:
            raise InvalidRequestError('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser '
                                      f"({' | '.join(TOOL_CALL_PARSERS)}) to be set on the server; or send "
                                      'tool_choice "required" or a named function', param="tool_choice")
        return ToolMode("auto", parser)
    if tool_choice == "none":
        return None
    if tool_choice == "required":
        return ToolMode("required", None)
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        name = (tool_choice.get("function") or {}).get("name")
        if name not in names:
            raise InvalidRequestError(f"tool_choice names function {name!r}, which is not among the tools "
                                      f"{sorted(names)}", param="tool_choice")
        return ToolMode("named", None, name)
    raise InvalidRequestError('tool_choice must be "none", "auto", "required" or {"type": "function", "function": '
                              '{"name": ...}}', param="tool_choice")


def forced_output(mode: ToolMode, tools: list[dict]) -> StructuredOutputsParams | None:
    """The constraint that makes a forced choice's output parse."""
    if mode.choice == "named":
        return StructuredOutputsParams(json=_parameters(next(_function(t) for t in tools
                                                            if _function(t)["name"] == mode.function)))
    if mode.choice == "required":
        call = {"anyOf": [{"type": "object", "properties": {"name": {"const": f["name"]},
                                                            "parameters": _parameters(f)},
                           "required": ["name", "parameters"], "additionalProperties": False}
                          for f in map(_function, tools)]}
        return StructuredOutputsParams(json={"type": "array", "items": call, "minItems": 1})
    return None


def check_tools(tools: list[dict]) -> None:
    for t in tools:
        if t.get("type") != "function" or not isinstance(t.get("function"), dict) or \
                not isinstance(t["function"].get("name"), str):
            raise InvalidRequestError('each tool is {"type": "function", "function": {"name": ..., "parameters": '
                                      '{...}}}', param="tools")


def _function(tool: dict) -> dict:
    return tool["function"]


def _parameters(function: dict) -> dict:
    return function.get("parameters") or {"type": "object", "properties": {}}


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _compact(text: str) -> str:
    parsed = _loads(text)
    return text if parsed is None else json.dumps(parsed)


def _call(obj: Any) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return ToolCall(obj["name"], args if isinstance(args, str) else json.dumps(args))
