"""A chat template rendered as transformers' `apply_chat_template(tokenize=False)` renders it: the same Jinja sandbox
with the same filters and globals (transformers.utils.chat_template_utils), importing nothing heavier than jinja2 so
that a worker process (tally/models/template_workers.py) starts in a tenth of a second. Two bounds of its own:
`*` cannot repeat a sequence past MAX_REPEAT_ITEMS, and `max_output_chars` stops a template that writes more."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

MAX_REPEAT_ITEMS = 1_000_000  # `'-' * 80` draws a rule; `[0] * 50000000` is an attack
CACHED_TEMPLATE_CHARS = 64 * 1024  # a model's template is compiled once; a larger one each time, so none piles up
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "  # transformers' marker of where a continued message ends
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # names templates read a turn's reasoning under


class TemplateLimitError(Exception):
    """A bound on rendering was exceeded; the message names it."""


class TemplateRejected(Exception):
    """The template raised (its raise_exception, a missing key, a wrong type): the conversation does not fit it."""


@dataclass(frozen=True)
class TemplateJob:
    """One rendering, as plain JSON data so that it can travel to a worker process."""

    template: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False  # leave the last turn open for the model to continue
    variables: dict[str, Any] = field(default_factory=dict)  # the tokenizer's special tokens, chat_template_kwargs


def render(job: TemplateJob, max_output_chars: int | None = None) -> str:
    """Raises TemplateLimitError, TemplateRejected, or MemoryError (which only a caller that set the limit can
    explain)."""
    try:
        return _render(job, max_output_chars)
    except (TemplateLimitError, MemoryError):
        raise
    except Exception as exc:  # noqa: BLE001 - a template's own errors come in every type
        raise TemplateRejected(str(exc)) from None


def _render(job: TemplateJob, max_output_chars: int | None) -> str:
    compiled = _cached(job.template) if len(job.template) <= CACHED_TEMPLATE_CHARS else _compile(job.template)
    # transformers drops the keys set to None: templates test for a key, and would print "None"
    messages = _alias_reasoning([{k: v for k, v in m.items() if v is not None} for m in job.messages])
    final = _tag_final_message(messages, job.template) if job.continue_final_message else None
    pieces, size = [], 0
    for piece in compiled.generate(messages=messages, tools=job.tools, documents=None,
                                   add_generation_prompt=job.add_generation_prompt, **job.variables):
        size += len(piece)
        if max_output_chars is not None and size > max_output_chars:
            raise TemplateLimitError(f"the chat template wrote more than {max_output_chars:,} characters, the limit "
                                     "on a rendered prompt")
        pieces.append(piece)
    text = "".join(pieces)
    return text if final is None else _cut_at_tag(text, final)


def _alias_reasoning(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A turn's reasoning under every name templates read it by, as transformers passes it."""
    out = []
    for m in messages:
        reasoning = next((m[k] for k in _REASONING_FIELDS if m.get(k) is not None), None)
        out.append(m if reasoning is None else {"thinking": reasoning, **m, "reasoning_content": reasoning})
    return out


def _tag_final_message(messages: list[dict[str, Any]], template: str) -> str:
    """transformers' way to continue the final message: mark where it ends, render, cut there."""
    if not messages:
        raise ValueError("continue_final_message is set but the conversation is empty")
    final = messages[-1].get("content")
    if final is None:
        raise ValueError('continue_final_message is set but the final message has no "content" to continue')
    if "content" not in template:
        raise ValueError('continue_final_message is set to "content" but the chat template does not read it')
    if isinstance(final, (list, tuple)):
        blocks = [dict(b) if isinstance(b, dict) else b for b in final]
        text_block = next((b for b in reversed(blocks) if isinstance(b, dict) and "text" in b), None)
        if text_block is None:
            raise ValueError("continue_final_message is set but the final message has no text to continue")
        final = text_block["text"]
        text_block["text"] += _CONTINUE_TAG
        messages[-1] = {**messages[-1], "content": blocks}
    else:
        messages[-1] = {**messages[-1], "content": final + _CONTINUE_TAG}
    return final


def _cut_at_tag(text: str, final: str) -> str:
    tag = _CONTINUE_TAG.strip()
    if final.strip() not in text or tag not in text:
        raise ValueError("continue_final_message is set but the final message does not appear in the chat after "
                         "applying the chat template (the template deletes part of it)")
    at = text.rindex(tag)
    # a template that trims whitespace trims it after the tag too
    return text[:at] if text[at:at + len(_CONTINUE_TAG)] == _CONTINUE_TAG else text[:at].rstrip()


@lru_cache(maxsize=8)
def _cached(template: str) -> jinja2.Template:
    return _compile(template)


def _compile(template: str) -> jinja2.Template:
    return _environment().from_string(template)


class _Sandbox(ImmutableSandboxedEnvironment):
    # Jinja folds constant expressions while compiling (`[0] * 50000000` allocated before any check could run)
    # except intercepted operators, which it leaves to call_binop at render time.
    intercepted_binops = frozenset({"*"})

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            _check_repeat(left, right)
        return super().call_binop(context, operator, left, right)


def _check_repeat(left: Any, right: Any) -> None:
    sequence, times = (left, right) if isinstance(right, int) else (right, left)
    if isinstance(sequence, (str, list, tuple)) and isinstance(times, int) \
            and len(sequence) * times > MAX_REPEAT_ITEMS:
        raise TemplateLimitError(f"the chat template repeats a sequence to {len(sequence) * times:,} items with *; "
                                 f"the limit is {MAX_REPEAT_ITEMS:,}")


class _Generation(Extension):
    """transformers' `{% generation %}` block marks the assistant's tokens for training; rendering shows its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.CallBlock:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


@lru_cache(maxsize=1)
def _environment() -> _Sandbox:
    """transformers' environment: its options, extensions, filters and globals."""
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes HTML characters, which a prompt must not see.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _TemplateDict:
    """`dict(...)` and `dict.fromkeys(...)` without the type itself, whose attributes lead out of the sandbox."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """A namespace that refuses underscore names, the way to CPython's internals."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # Jinja's signature trick: `namespace(self=...)` works
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot store underscore-prefixed attributes on a "
                                                  f"namespace, but got {name!r}")
