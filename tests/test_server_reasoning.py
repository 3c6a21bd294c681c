"""--reasoning-parser through the official openai client: chat returns the thinking as `reasoning_content` and
`reasoning`, the answer as `content`, streamed and not, exactly the parser's split of the text the model wrote (read
back through /v1/completions with the same prompt and seed); enable_thinking false leaves all text to the answer;
a constraint or a forced tool call starts after the thinking, and auto tool choice reads calls from the answer only;
max_tokens counts both; /v1/messages returns the
thinking as thinking blocks through the official anthropic client. A random model writes think
tags when sampling is narrowed to a few tokens, the tags among them (tests/support/think_models.py)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import anthropic
import httpx
import openai
import pytest
from support.servers import started
from support.think_models import QWEN3_TEMPLATE, R1_TEMPLATE, think_checkpoint
from transformers import AutoTokenizer

from tally.errors import InvalidRequestError
from tally.server.chat import ChatCompletions
from tally.server.cli import parse_args
from tally.server.process import ServerProcess
from tally.server.reasoning import reasoning_parser

FLAGS = ["--served-model-name", "tiny", "--dtype", "float32", "--max-model-len", "256", "--kv-cache-memory", "8MB",
         "--log-level", "warning"]
ASK = [{"role": "user", "content": "Why?"}]
MAX_TOKENS = 24
NUMBER = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return think_checkpoint(tmp_path_factory.mktemp("think"))


@pytest.fixture(scope="module")
def servers(model):
    """A deepseek_r1 server (with hermes tool calls) and a qwen3 one, each with its model's kind of template."""
    (model / "r1.jinja").write_text(R1_TEMPLATE)
    (model / "qwen3.jinja").write_text(QWEN3_TEMPLATE)
    r1 = ServerProcess([str(model), *FLAGS, "--chat-template", str(model / "r1.jinja"), "--reasoning-parser",
                        "deepseek_r1", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"])
    qwen3 = ServerProcess([str(model), *FLAGS, "--chat-template", str(model / "qwen3.jinja"), "--reasoning-parser",
                           "qwen3"])
    with started(r1, qwen3) as s:
        yield {"deepseek_r1": s[0], "qwen3": s[1]}


def _client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=120)


def _narrowed(server: ServerProcess) -> dict:
    """Sampling among a few words and both tags: the random model then writes tags now and then."""
    tok = httpx.post(f"{server.url}/tokenize", json={"prompt": "<think></think>a bF"}).json()["tokens"]
    return dict(temperature=1.0, seed=1, max_tokens=MAX_TOKENS, extra_body={"allowed_token_ids": tok})


@pytest.mark.parametrize("parser", ["deepseek_r1", "qwen3"])
def test_chat_returns_the_parsers_split_of_the_text_streamed_and_not(servers, parser: str) -> None:
    server = servers[parser]
    client, kw = _client(server), _narrowed(server)
    prompt = httpx.post(f"{server.url}/tokenize", json={"messages": ASK}).json()["tokens"]
    raw = client.completions.create(model="tiny", prompt=prompt, **kw).choices[0].text
    assert "</think>" in raw
    reasoning, answer = reasoning_parser(parser).split(raw)
    assert reasoning and answer  # the text has both parts: the split is not trivial

    done = client.chat.completions.create(model="tiny", messages=ASK, **kw)
    message = done.choices[0].message
    assert (message.model_extra["reasoning_content"], message.content) == (reasoning, answer)
    assert message.model_extra["reasoning"] == reasoning
    # max_tokens counts thinking and answer together
    assert (done.usage.completion_tokens, done.choices[0].finish_reason) == (MAX_TOKENS, "length")

    streamed = {"reasoning_content": "", "reasoning": "", "content": ""}
    for chunk in client.chat.completions.create(model="tiny", messages=ASK, stream=True, **kw):
        delta = chunk.choices[0].delta
        for key in streamed:
            streamed[key] += getattr(delta, key, None) or (delta.model_extra or {}).get(key) or ""
    assert streamed == {"reasoning_content": reasoning, "reasoning": reasoning, "content": answer}


def test_enable_thinking_false_leaves_all_text_to_the_answer(servers) -> None:
    server = servers["qwen3"]
    client, kw = _client(server), _narrowed(server)
    thinking = client.chat.completions.create(model="tiny", messages=ASK, **kw)
    done = client.chat.completions.create(model="tiny", messages=ASK, **{**kw, "extra_body": {
        **kw["extra_body"], "chat_template_kwargs": {"enable_thinking": False}}})
    # the template got the switch: it closed an empty thinking section in the prompt ("<think>\n\n</think>\n\n")
    assert done.usage.prompt_tokens > thinking.usage.prompt_tokens
    assert done.choices[0].message.model_extra["reasoning_content"] is None
    assert "think>" in done.choices[0].message.content  # the tags the model wrote stay in the answer


def _token(server: ServerProcess, tag: str) -> str:
    return str(httpx.post(f"{server.url}/tokenize", json={"prompt": tag}).json()["tokens"][0])


@pytest.mark.parametrize("parser,bias", [
    ("deepseek_r1", {"</think>": 3.0}), ("qwen3", {"<think>": 8.0, "</think>": 3.0}), ("qwen3", {}),
], ids=["r1", "qwen3-thinking", "qwen3-answering-at-once"])
def test_a_constraint_binds_the_answer_only(servers, parser: str, bias: dict[str, float]) -> None:
    """The JSON schema binds the answer only: the thinking before </think> is free (here the model's random text,
    far from JSON), and the answer parses, streamed and not. Under qwen3 a model may also answer without thinking
    (no <think> first): then the constraint binds from the first token."""
    server = servers[parser]
    client = _client(server)
    kw = dict(model="tiny", messages=ASK, max_tokens=80, temperature=1.0, seed=1,
              logit_bias={_token(server, tag): b for tag, b in bias.items()},
              response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": NUMBER}})
    message = client.chat.completions.create(**kw).choices[0].message
    reasoning = message.model_extra["reasoning_content"]
    if bias:
        assert reasoning and not reasoning.lstrip().startswith("{")
    else:
        assert reasoning is None
    assert set(json.loads(message.content)) == {"n"}
    content, streamed_reasoning = "", ""
    for chunk in client.chat.completions.create(stream=True, **kw):
        content += chunk.choices[0].delta.content or ""
        streamed_reasoning += (chunk.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
    assert (streamed_reasoning, content) == (reasoning or "", message.content)


def test_forced_tool_call_is_read_from_the_answer(servers) -> None:
    server = servers["deepseek_r1"]
    end = _token(server, "</think>")
    tool = {"type": "function", "function": {"name": "count", "parameters": NUMBER}}
    choice = _client(server).chat.completions.create(
        model="tiny", messages=ASK, max_tokens=80, temperature=1.0, seed=1, logit_bias={end: 3.0}, tools=[tool],
        tool_choice={"type": "function", "function": {"name": "count"}}).choices[0]
    assert choice.message.model_extra["reasoning_content"]
    (call,) = choice.message.tool_calls
    assert call.function.name == "count" and set(json.loads(call.function.arguments)) == {"n"}


def test_auto_tool_choice_reads_the_call_from_the_answer_and_returns_the_thinking(servers) -> None:
    """--enable-auto-tool-choice beside the reasoning parser: the thinking comes back as reasoning, never as content
    nor read by the tool parser; the answer (steered into hermes' format by a constraint, which binds the answer
    only) as a tool call, streamed and not."""
    server = servers["deepseek_r1"]
    client = _client(server)
    tool = {"type": "function", "function": {"name": "count", "parameters": NUMBER}}
    call = r'<tool_call>\n\{"name": "count", "arguments": \{"n": [1-9]\}\}\n</tool_call>'
    kw = dict(model="tiny", messages=ASK, max_tokens=80, temperature=1.0, seed=1, tools=[tool],
              logit_bias={_token(server, "</think>"): 3.0}, extra_body={"structured_outputs": {"regex": call}})
    choice = client.chat.completions.create(**kw).choices[0]
    reasoning = choice.message.model_extra["reasoning_content"]
    assert reasoning and "tool_call" not in reasoning and not choice.message.content
    assert choice.finish_reason == "tool_calls"
    (done,) = choice.message.tool_calls
    assert done.function.name == "count" and 1 <= json.loads(done.function.arguments)["n"] <= 9
    streamed, content, calls, reason = "", "", {}, None
    for chunk in client.chat.completions.create(stream=True, **kw):
        delta = chunk.choices[0].delta
        streamed += (delta.model_extra or {}).get("reasoning_content") or ""
        content += delta.content or ""
        for c in delta.tool_calls or []:
            piece = calls.setdefault(c.index, {"name": "", "arguments": ""})
            piece["name"] += c.function.name or ""
            piece["arguments"] += c.function.arguments or ""
        reason = chunk.choices[0].finish_reason or reason
    assert (streamed, content.strip(), reason) == (reasoning, "", "tool_calls")
    assert list(calls.values()) == [{"name": "count", "arguments": done.function.arguments}]


def test_a_constraint_needs_an_end_tag_of_one_token(model) -> None:
    """The grammar waits for the end tag's token; a tag the vocabulary spells in several tokens is refused by name."""
    chat = ChatCompletions(AutoTokenizer.from_pretrained(model), renderer=None,
                           reasoning_parser=reasoning_parser("tags:<r>,</r>"))
    req = chat.parse({"messages": ASK, "response_format": {"type": "json_object"}})
    with pytest.raises(InvalidRequestError, match="'</r>' to be one token") as refused:
        chat.engine_requests(req, SimpleNamespace(sampling_defaults={}, max_model_len=256))
    assert refused.value.param == "response_format"


def test_unknown_parser_is_refused_with_the_known_ones(capsys) -> None:
    with pytest.raises(SystemExit):
        parse_args(["m", "--reasoning-parser", "deepseek"])
    assert "known: deepseek_r1, qwen3" in capsys.readouterr().err


def _anthropic(server: ServerProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=120)


def test_messages_return_the_thinking_as_thinking_blocks_streamed_and_not(servers) -> None:
    """Greedy, the model's text is the completion of the same prompt; the message holds the parser's split of it: a
    thinking block (R1's template opens the thinking), then the answer's text block if there is one."""
    server = servers["deepseek_r1"]
    prompt = httpx.post(f"{server.url}/tokenize", json={"messages": ASK}).json()["tokens"]
    raw = _client(server).completions.create(model="tiny", prompt=prompt, max_tokens=MAX_TOKENS,
                                             temperature=0.0).choices[0].text
    reasoning, answer = reasoning_parser("deepseek_r1").split(raw)
    expected = [("thinking", reasoning)] + ([("text", answer)] if answer else [])
    kw = dict(model="tiny", messages=ASK, max_tokens=MAX_TOKENS, extra_body={"temperature": 0.0})  # thinking unsaid
    message = _anthropic(server).messages.create(**kw)
    assert [(b.type, b.thinking if b.type == "thinking" else b.text) for b in message.content] == expected
    assert message.usage.output_tokens == MAX_TOKENS and message.stop_reason == "max_tokens"
    with _anthropic(server).messages.stream(**kw) as stream:
        streamed = stream.get_final_message()
    assert streamed.content == message.content


def test_messages_thinking_disabled_reaches_the_template_and_budget_is_checked(servers) -> None:
    server = servers["qwen3"]
    client = _anthropic(server)
    kw = dict(model="tiny", messages=ASK, max_tokens=8, extra_body={"temperature": 0.0})
    on = client.messages.create(**kw)
    off = client.messages.create(thinking={"type": "disabled"}, **kw)
    # the template closed an empty thinking section itself; the whole text is the answer
    assert off.usage.input_tokens > on.usage.input_tokens
    assert [b.type for b in off.content] == ["text"]
    with pytest.raises(anthropic.BadRequestError, match="budget_tokens") as refused:
        client.messages.create(thinking={"type": "enabled", "budget_tokens": 1024}, **kw)  # not below max_tokens
    assert refused.value.body["error"]["type"] == "invalid_request_error"
    enabled = client.messages.count_tokens(model="tiny", messages=ASK,
                                           thinking={"type": "enabled", "budget_tokens": 1024})
    assert enabled.input_tokens == on.usage.input_tokens  # the switch on is the template's default


def test_responses_return_the_thinking_as_a_reasoning_item_streamed_and_not(servers) -> None:
    server = servers["deepseek_r1"]
    client = _client(server)
    prompt = httpx.post(f"{server.url}/tokenize", json={"messages": ASK}).json()["tokens"]
    raw = client.completions.create(model="tiny", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0.0).choices[0].text
    reasoning, answer = reasoning_parser("deepseek_r1").split(raw)
    kw = dict(model="tiny", input="Why?", max_output_tokens=MAX_TOKENS, temperature=0.0)
    done = client.responses.create(**kw)
    item = done.output[0]
    assert item.type == "reasoning" and item.content[0].text == reasoning
    assert done.output_text == answer
    final = [e.response for e in client.responses.create(stream=True, **kw) if e.type == "response.incomplete"]
    items = [[o.model_dump(exclude={"id"}) for o in r.output] for r in (final[0], done)]
    assert items[0] == items[1]
