"""Chat messages through a model's chat template: the one rendering used by the server, `LLM.chat`,
`tally generate`, calibration and the quality suites. It renders in this process (tally/models/template_sandbox.py)
or, given a `renderer` (the server's tally/models/template_workers.py), in a bounded worker process.

A model without a template is each caller's decision, so each passes `without_template`: the server and
`LLM.chat` refuse (`refuse_without_template`), offline tools join the turns as plain text."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tally.errors import InvalidRequestError
from tally.models.template_sandbox import TemplateJob, TemplateLimitError, TemplateRejected, render
from tally.models.tokenizer import Tokenizer, encode_within

MAX_ERROR_CHARS = 500  # of a template's own error message, quoted back to the client

Messages = list[dict[str, Any]]
Renderer = Callable[[TemplateJob], str]


def has_chat_template(tokenizer: Tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def refuse_without_template(messages: Messages) -> str:
    raise InvalidRequestError("this model has no chat template; send a plain prompt (/v1/completions, "
                              "LLM.generate) instead of chat messages", param="messages")


def join_turns(separator: str, end: str = "") -> Callable[[Messages], str]:
    """A `without_template` that joins the messages' contents."""
    return lambda messages: separator.join(str(m["content"]) for m in messages) + end


def render_chat(tokenizer: Tokenizer, messages: Messages, *, without_template: Callable[[Messages], str],
                add_generation_prompt: bool = True, chat_template: str | None = None,
                continue_final_message: bool = False, template_kwargs: dict[str, Any] | None = None,
                tools: list[dict[str, Any]] | None = None, renderer: Renderer = render) -> str:
    """The text transformers' `apply_chat_template(tokenize=False)` gives. `chat_template` replaces the model's;
    `continue_final_message` leaves the last (assistant) turn open for the model to continue; `template_kwargs`
    reach the template (e.g. Qwen3's enable_thinking); `tools` (OpenAI's form) are the template's to show the model
    (a template without tool support ignores them)."""
    if chat_template is None and not has_chat_template(tokenizer):
        return without_template(messages)
    try:
        job = TemplateJob(tokenizer.get_chat_template(chat_template, tools), messages, tools,
                          add_generation_prompt and not continue_final_message, continue_final_message,
                          {**tokenizer.special_tokens_map, **(template_kwargs or {})})
        return renderer(job)
    except TemplateLimitError as exc:
        raise InvalidRequestError(f"{exc}; shorten the conversation or fix the template",
                                  param="chat_template") from None
    except (TemplateRejected, ValueError) as exc:  # ValueError: no template of that name (a dict of templates)
        raise InvalidRequestError(f"the chat template rejected these messages: {str(exc)[:MAX_ERROR_CHARS]}",
                                  param="messages") from None


def chat_prompt(tokenizer: Tokenizer, messages: Messages, *, without_template: Callable[[Messages], str],
                max_prompt_tokens: int | None = None, **render: Any) -> dict[str, Any]:
    """The engine's prompt: the rendered text (render_chat's options) and its token ids; with `max_prompt_tokens`, a
    text no such context could hold is refused before it is tokenized."""
    text = render_chat(tokenizer, messages, without_template=without_template, **render)
    # The template already holds any BOS it wants; encoding must not add another.
    if max_prompt_tokens is None:
        return {"prompt": text, "prompt_token_ids": tokenizer.encode(text, add_special_tokens=False)}
    return {"prompt": text, "prompt_token_ids": encode_within(tokenizer, text, max_prompt_tokens, param="messages",
                                                              add_special_tokens=False)}
