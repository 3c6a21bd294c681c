"""Function calling: OpenAI's `tools` and `tool_choice`, with vLLM's flags and semantics. "auto" parses the model's
text with the `--tool-call-parser` named (which needs `--enable-auto-tool-choice`, as in vLLM); "required" and a named
function constrain decoding, so the calls always parse; "none" only shows the tools to the chat template. A stream
sends each call's name once complete, then its arguments in pieces that add up to the non-streamed answer's,
character for character (tally/server/tool_parsers.py reads the growing text)."""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from tally.errors import InvalidRequestError, echo
from tally.sampling_params import StructuredOutputsParams
from tally.server.tool_parsers import PartialCall, ToolView, hermes, llama3_json, required

TOOL_CALL_PARSERS = {"hermes": hermes, "llama3_json": llama3_json}


def call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str = field(default_factory=call_id)

    def as_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ToolMode:
    """How one chat request's output becomes tool calls."""

    choice: str  # "auto" | "required" | "named"
    parser: str | None  # auto only
    function: str | None = None  # named only

    @property
    def forced(self) -> bool:
        return self.choice != "auto"

    def view(self, text: str, final: bool) -> ToolView:
        """A choice's text so far as content and calls; `final`: the choice has ended, and a text whose calls do
        not all parse is content (auto) or nothing (forced)."""
        if self.choice == "named":  # the constrained output is the arguments; space at its end waits
            if not (final or text.strip()):
                return ToolView("")
            return ToolView("", [PartialCall(self.function, text.strip(), len(text) if final else None)])
        view = required(text) if self.choice == "required" else TOOL_CALL_PARSERS[self.parser](text)
        if final and not view.called:
            return ToolView("" if self.forced else text)
        return view

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(content, calls) of a finished choice."""
        view = self.view(text, final=True)
        if not view.calls:
            return (None if self.forced else text), []
        return view.content.strip() or None, [ToolCall(c.name, c.arguments) for c in view.calls]


def stream_delta(mode: ToolMode, before: str, text: str, final: bool) -> tuple[str, list[dict], bool]:
    """What one chunk sends for a choice whose text grew from `before` to `text`: the new content, the
    `tool_calls` deltas (a call's first one with its id, type and name), and whether the choice ended in calls."""
    was, now = mode.view(before, final=False), mode.view(text, final)
    calls = []
    for i, call in enumerate(now.calls):
        old = was.calls[i] if i < len(was.calls) else PartialCall()
        delta: dict = {"index": i}
        if call.name is not None and old.name is None:
            delta.update(id=call_id(), type="function", function={"name": call.name})
        if len(call.arguments) > len(old.arguments):
            delta.setdefault("function", {})["arguments"] = call.arguments[len(old.arguments):]
        if len(delta) > 1:
            calls.append(delta)
    return now.content[len(was.content):], calls, final and bool(now.calls)


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
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str):
            raise InvalidRequestError('tool_choice.function must be {"name": "..."} naming one of the tools, got '
                                      f"{echo(function)}", param="tool_choice.function")
        if name not in names:
            raise InvalidRequestError(f"tool_choice names function {echo(name)}, which is not among the tools "
                                      f"{echo(sorted(names))}", param="tool_choice")
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
