"""Tool calls read out of a choice's text as it grows: the `--tool-call-parser` formats and the forced choices'
constrained output.

A view of the text so far is its content and the calls begun, each with its name once the name's string is
complete and its arguments as the exact text generated so far (held back until the name is known). A stream sends
the difference between the views of the text before and after each chunk, and a non-streamed answer takes the view
of the whole text, so a stream's arguments add up to the non-streamed ones character for character. Reading is by
JSON tokens (a regular expression finds them), not characters."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
ARGUMENT_KEYS = ("arguments", "parameters")
# One JSON token after optional whitespace: a string (maybe unfinished: `q` is set when it closed), a punctuation
# mark, or a run of anything else (numbers, literals, stray text).
_TOKEN = re.compile(r'\s*(?:(?P<string>"(?:[^"\\]|\\.)*(?:(?P<q>")|\\?\Z))'
                    r'|(?P<mark>[{}\[\]:,;])|(?P<other>[^\s{}\[\]:,;"]+))', re.DOTALL)
_SPACE = re.compile(r"\s*")


@dataclass(frozen=True)
class PartialCall:
    name: str | None = None  # None until its string is complete
    arguments: str = ""  # the arguments' text so far, exactly as generated; "" until the name is known
    end: int | None = None  # where the call's text ends; None while it is open
    valid: bool = True  # False once it cannot be a call (bad JSON, no name, stray text)

    @property
    def done(self) -> bool:
        return self.end is not None and self.valid


@dataclass(frozen=True)
class ToolView:
    content: str  # the text that is content, as far as it is known not to begin a call
    calls: list[PartialCall] = field(default_factory=list)

    @property
    def called(self) -> bool:
        return bool(self.calls) and all(c.done for c in self.calls)


def hermes(text: str) -> ToolView:
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks after optional content."""
    first = text.find(HERMES_OPEN)
    if first < 0:  # hold back a tail that may be the tag's beginning
        held = next((k for k in range(min(len(HERMES_OPEN) - 1, len(text)), 0, -1)
                     if HERMES_OPEN.startswith(text[-k:])), 0)
        return ToolView(text[:len(text) - held])
    calls, at = [], first
    while at >= 0:
        body = _SPACE.match(text, at + len(HERMES_OPEN)).end()
        if body == len(text):
            calls.append(PartialCall())
            break
        call = read_call(text, body)
        if call.end is not None:  # only space may stand between the object and its closing tag
            after = _SPACE.match(text, call.end).end()
            if after < len(text) and not HERMES_CLOSE.startswith(text[after:after + len(HERMES_CLOSE)]):
                call = PartialCall(call.name, call.arguments, call.end, False)
        calls.append(call)
        if call.end is None:
            break
        at = text.find(HERMES_OPEN, call.end)
    return ToolView(text[:first], calls)


def llama3_json(text: str) -> ToolView:
    """Llama 3's bare `{"name": ..., "parameters": {...}}` objects from the start of the output, joined by `;`."""
    start = _SPACE.match(text).end()
    if start == len(text):
        return ToolView("")
    if text[start] != "{":
        return ToolView(text)
    return ToolView("", read_calls(text, start, ";"))


def required(text: str) -> ToolView:
    """tool_choice "required": the constrained `[{"name": ..., "parameters": {...}}, ...]`."""
    start = _SPACE.match(text).end()
    if start == len(text):
        return ToolView("")
    if text[start] != "[":
        return ToolView("", [PartialCall(end=start, valid=False)])
    body = _SPACE.match(text, start + 1).end()
    return ToolView("", read_calls(text, body, ",", closer="]") if body < len(text) else [])


def read_calls(text: str, start: int, separator: str, closer: str | None = None) -> list[PartialCall]:
    """Call objects from text[start], one after another with `separator` between them."""
    calls = []
    while True:
        call = read_call(text, start)
        calls.append(call)
        if call.end is None or not call.valid:
            return calls
        at = _SPACE.match(text, call.end).end()
        if at == len(text) or text[at] == closer:
            return calls
        if text[at] != separator:
            return [*calls, PartialCall(end=at, valid=False)]
        start = _SPACE.match(text, at + 1).end()
        if start == len(text):  # nothing after the separator (yet)
            return calls


def read_call(text: str, start: int) -> PartialCall:
    """The call object at text[start] (its `{`), as far as the text goes."""
    depth, key, expect = 0, None, "key"
    name = args_start = args_end = None
    scalar_args = False
    for m in _TOKEN.finditer(text, start):
        string, mark = m.group("string"), m.group("mark")
        if depth == 0:
            if mark != "{":
                return PartialCall(end=m.start(), valid=False)
            depth = 1
        elif mark in ("{", "["):
            if depth == 1 and expect == "value" and key in ARGUMENT_KEYS and args_start is None:
                args_start = m.start("mark")
            depth += 1
        elif mark in ("}", "]"):
            depth -= 1
            if depth == 1 and args_start is not None and args_end is None and not scalar_args:
                args_end = m.end()
            if depth == 0:
                return _closed(text, start, m.end(), name, args_start, args_end, scalar_args)
            expect = "comma"
        elif depth > 1:
            continue
        elif mark == ":":
            expect = "value"
        elif mark == ",":
            expect = "key"
        elif expect == "key":
            key = _decode(string) if string and m.group("q") else None
            expect = "colon"
        elif expect == "value":
            finished = m.group("q") is not None if string else m.end() < len(text)
            if key == "name" and string and finished:
                name = _decode(string)
            elif key in ARGUMENT_KEYS and args_start is None:
                args_start, scalar_args = m.start("string" if string else "other"), True
                args_end = m.end() if finished else None
            expect = "comma"
    return PartialCall(name, _arguments(text, name, args_start, args_end, scalar_args, closed=False))


def _closed(text: str, start: int, end: int, name: str | None, args_start: int | None, args_end: int | None,
            scalar_args: bool) -> PartialCall:
    try:
        obj = json.loads(text[start:end])
    except ValueError:
        return PartialCall(name, "", end, False)
    valid = isinstance(obj, dict) and isinstance(obj.get("name"), str)
    return PartialCall(name, _arguments(text, name, args_start, args_end, scalar_args, closed=True), end, valid)


def _arguments(text: str, name: str | None, start: int | None, end: int | None, scalar: bool, closed: bool) -> str:
    """The arguments as OpenAI sends them (JSON text): an object's or array's text as generated, growing while it
    is open; a string's value, and any other scalar's text, once complete; "{}" for a call that had none."""
    if name is None:
        return ""
    if start is None:
        return "{}" if closed else ""
    if not scalar:
        return text[start:end]
    if end is None:
        return ""
    raw = text[start:end]
    return (_decode(raw) or "") if raw.startswith('"') else raw


def _decode(string: str) -> str | None:
    try:
        return json.loads(string)
    except ValueError:
        return None
