"""Request bodies of the OpenAI API (with vLLM's extra sampling fields), validated by pydantic.

A field this server does not implement is refused with a 400 that names it (`suffix`, `functions`, ...), never
silently ignored: a client must not believe it got what it asked for. Fields that only describe the caller and
change nothing about the answer (`user`, `metadata`, ...) are accepted and unused."""
from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tally.errors import InvalidRequestError
from tally.sampling_params import SamplingParams, StructuredOutputsParams


class OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="ignore")


# Accepted and unused: they describe the caller or ask for bookkeeping that changes nothing about the answer.
HARMLESS_FIELDS = frozenset({"user", "metadata", "store", "service_tier", "parallel_tool_calls"})


def refuse_unsupported(body: dict, model: type[BaseModel], harmless: frozenset[str] = HARMLESS_FIELDS) -> None:
    """400 naming the body's fields that `model` does not implement (and that are not `harmless`)."""
    unknown = sorted(set(body) - set(model.model_fields) - harmless)
    if body.get("tool_choice") == "none":  # asks for nothing (clients send it on completions too)
        unknown = [f for f in unknown if f != "tool_choice"]
    if unknown:
        hint = " (send tools and tool_choice, the API's current form)" if {"functions", "function_call"} & set(
            unknown) else ""
        raise InvalidRequestError(f"{', '.join(unknown)}: not supported by this server{hint}; omit "
                                  f"{'it' if len(unknown) == 1 else 'them'}", param=unknown[0])


class StreamOptions(OpenAIModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: usage so far in every chunk


class ResponseFormat(OpenAIModel):
    type: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: dict[str, Any] | None = None  # OpenAI's {"name": ..., "schema": {...}, "strict": true}


class SamplingFields(OpenAIModel):
    """Fields both generation endpoints share; `to_sampling_params` is their one translation."""

    model: str | None = None
    n: int = 1
    best_of: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[str, float] | None = None  # OpenAI sends token ids as strings
    allowed_token_ids: list[int] | None = None
    truncate_prompt_tokens: int | None = None
    bad_words: list[str] | None = None
    priority: int = 0  # vLLM's: lower runs sooner, under --scheduling-policy priority
    stream: bool = False
    stream_options: StreamOptions | None = None
    # Constrained decoding: OpenAI's response_format, vLLM's structured_outputs and its older guided_* fields.
    response_format: ResponseFormat | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    def structured(self) -> StructuredOutputsParams | None:
        """The one constraint the request asks for, from whichever field it used; 400 when it used several."""
        asked = {}
        fmt = self.response_format
        if fmt is not None and fmt.type == "json_object":
            asked["response_format"] = {"json_object": True}
        elif fmt is not None and fmt.type == "json_schema":
            schema = (fmt.json_schema or {}).get("schema")
            if not isinstance(schema, dict):
                raise InvalidRequestError('response_format json_schema needs {"json_schema": {"name": ..., '
                                          '"schema": {...}}}', param="response_format")
            asked["response_format"] = {"json": schema}
        if self.structured_outputs is not None:
            asked["structured_outputs"] = self.structured_outputs
        for name, key in (("guided_json", "json"), ("guided_regex", "regex"), ("guided_choice", "choice"),
                          ("guided_grammar", "grammar")):
            if getattr(self, name) is not None:
                asked[name] = {key: getattr(self, name)}
        if len(asked) > 1:
            raise InvalidRequestError(f"ask for one constraint at a time; got {sorted(asked)}", param=sorted(asked)[0])
        if not asked:
            return None
        (field, spec), = asked.items()
        known = {"json", "regex", "choice", "grammar", "json_object"}
        if not isinstance(spec, dict) or set(spec) - known:
            raise InvalidRequestError(f"{field} takes one of {sorted(known)}", param=field)
        try:
            return StructuredOutputsParams(**spec)
        except InvalidRequestError as e:
            raise InvalidRequestError(str(e), param=field) from None

    def to_sampling_params(self, max_tokens: int | None, logprobs: int | None, prompt_logprobs: int | None = None,
                           defaults: dict[str, float] | None = None) -> SamplingParams:
        """`defaults`: what the checkpoint's generation config sets for fields the request leaves unset."""
        bias = None
        if self.logit_bias is not None:
            try:
                bias = {int(t): b for t, b in self.logit_bias.items()}
            except ValueError:
                raise InvalidRequestError("logit_bias keys must be token ids", param="logit_bias") from None
        given = {k: v for k, v in dict(
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, min_p=self.min_p,
            presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty).items() if v is not None}
        # the default max_tokens stays unset here: the engine fits it to the room the prompt leaves
        given = {**{k: v for k, v in (defaults or {}).items() if k != "max_tokens"}, **given}
        return SamplingParams(
            n=self.n, best_of=self.best_of, seed=self.seed, stop=self.stop, stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos, min_tokens=self.min_tokens, skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output, max_tokens=max_tokens,
            logprobs=logprobs, prompt_logprobs=prompt_logprobs, structured_outputs=self.structured(),
            logit_bias=bias, allowed_token_ids=self.allowed_token_ids, bad_words=self.bad_words,
            truncate_prompt_tokens=self.truncate_prompt_tokens, **given)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None


class TextPart(OpenAIModel):
    type: str = "text"
    text: str = ""


class ChatMessage(OpenAIModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None  # None only for an assistant turn (one that called tools)
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant turn's calls, as the API returned them
    tool_call_id: str | None = None  # a tool turn: the call it answers
    reasoning_content: str | None = None  # an assistant turn's thinking, as --reasoning-parser returned it
    reasoning: str | None = None  # the same, under the other name clients use

    @model_validator(mode="after")
    def _content_given(self) -> ChatMessage:
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs content (a string or a list of text parts)")
        return self

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        kinds = sorted({p.type for p in self.content if p.type != "text"})
        if kinds:
            raise InvalidRequestError(f"message content parts of type {kinds} are not supported; send text parts",
                                      param="messages")
        return "".join(p.text for p in self.content)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    chat_template: str | None = None  # vLLM's: this request's template instead of the model's
    chat_template_kwargs: dict[str, Any] | None = None  # reach the template, e.g. Qwen3's enable_thinking
    continue_final_message: bool = False
    echo: bool = False  # vLLM's: the answer starts with the last message when that is the assistant's
    add_generation_prompt: bool = True


class TokenizeRequest(OpenAIModel):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(OpenAIModel):
    model: str | None = None
    tokens: list[int]


def finite(x: float) -> float:
    """JSON cannot carry -inf; a logprob of -inf is reported as the most negative float."""
    return x if math.isfinite(x) else -9999.0
