"""Anthropic's Messages API through the official `anthropic` client against a real `tally serve`: a streamed answer
adds up to the whole one, block for block; tools (forced, and "auto" read by the hermes parser) come back as tool_use
blocks whose streamed input_json pieces add up to the input, and tool results go back; stop reasons map;
count_tokens counts the prompt the answer's usage reports; x-api-key authenticates; unsupported fields get
Anthropic-shaped 400s naming them."""
from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import pytest

from tally.server.process import ServerProcess

KEY = "sekrit"
FLAGS = ["--served-model-name", "tiny", "--dtype", "float32", "--max-model-len", "256", "--kv-cache-memory", "8MB",
         "--log-level", "warning", "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--api-key", KEY]
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"name": "get_weather", "description": "Weather forecast", "input_schema": WEATHER}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"extra_body": {"temperature": 0}}


@pytest.fixture(scope="module")
def server(tiny_llama):
    with ServerProcess([str(tiny_llama), *FLAGS]) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=120)


def _streamed(client, **kw) -> tuple[list[str], list[dict], anthropic.types.Message]:
    """The event types in order, the blocks rebuilt from the deltas, and the SDK's own final message."""
    kinds, blocks = [], {}
    with client.messages.stream(model="tiny", messages=kw.pop("messages", ASK), **kw) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "content_block_start":
                blocks[event.index] = {"type": event.content_block.type, "text": "", "json": "",
                                       "name": getattr(event.content_block, "name", None)}
            elif event.type == "content_block_delta" and event.delta.type == "text_delta":
                blocks[event.index]["text"] += event.delta.text
            elif event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                blocks[event.index]["json"] += event.delta.partial_json
        final = stream.get_final_message()
    return kinds, [blocks[i] for i in sorted(blocks)], final


def test_a_streamed_message_adds_up_to_the_whole_one(client):
    kw = dict(max_tokens=12, system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
              metadata={"user_id": "u1"}, **GREEDY)
    whole = client.messages.create(model="tiny", messages=ASK, **kw)
    kinds, blocks, final = _streamed(client, **kw)
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 1
    assert whole.stop_reason == final.stop_reason == "max_tokens" and whole.usage.output_tokens == 12
    assert blocks == [{"type": "text", "text": whole.content[0].text, "json": "", "name": None}]
    assert final.content[0].text == whole.content[0].text and final.usage.input_tokens == whole.usage.input_tokens
    counted = client.messages.count_tokens(model="tiny", messages=ASK, system=kw["system"])
    assert counted.input_tokens == whole.usage.input_tokens


def test_a_stop_sequence_is_reported_as_the_stop_reason(client):
    whole = client.messages.create(model="tiny", messages=ASK, max_tokens=40, **GREEDY)
    text = whole.content[0].text
    stop = text[3:5]
    r = client.messages.create(model="tiny", messages=ASK, max_tokens=40, stop_sequences=[stop], **GREEDY)
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == stop
    assert r.content[0].text == text[:text.index(stop)]


def test_a_forced_tool_gives_a_tool_use_block_whose_streamed_input_adds_up(client):
    for choice in ({"type": "tool", "name": "get_weather"}, {"type": "any", "disable_parallel_tool_use": True}):
        r = client.messages.create(model="tiny", messages=ASK, max_tokens=120, tools=TOOLS, tool_choice=choice)
        (block,) = r.content
        assert r.stop_reason == "tool_use" and block.type == "tool_use" and block.name == "get_weather"
        assert block.id.startswith("toolu_")
        jsonschema.validate(block.input, WEATHER)
    kw = dict(max_tokens=120, tools=TOOLS, tool_choice={"type": "tool", "name": "get_weather"},
              extra_body={"temperature": 1.0, "top_k": 50})
    kinds, blocks, final = _streamed(client, **kw)
    assert [b["type"] for b in blocks] == ["tool_use"] and blocks[0]["name"] == "get_weather"
    assert kinds.count("content_block_delta") > 1  # the input streams as it is generated
    assert json.loads(blocks[0]["json"]) == final.content[0].input and final.stop_reason == "tool_use"


def test_tool_results_go_back_to_the_model_and_auto_answers_in_text_when_it_calls_nothing(client):
    # a random model never writes the parser's <tool_call> tags on its own, and this API has no regex constraint to
    # steer it (tests/test_server_tools.py covers the parser through chat): here "auto" must answer in text
    # with a forced call instead, the conversation goes on: the assistant's tool_use and the user's tool_result
    call = client.messages.create(model="tiny", messages=ASK, max_tokens=120, tools=TOOLS,
                                  tool_choice={"type": "tool", "name": "get_weather"}).content[0]
    history = [*ASK, {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
                                                       {"type": "tool_use", "id": call.id, "name": call.name,
                                                        "input": call.input}]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                             "content": [{"type": "text", "text": "Sunny, 22 C"}]},
                                            {"type": "text", "text": "Thanks!"}]}]
    r = client.messages.create(model="tiny", messages=history, max_tokens=8, tools=TOOLS, **GREEDY)
    assert r.stop_reason in ("end_turn", "max_tokens") and r.content[0].type == "text"
    assert r.usage.input_tokens == client.messages.count_tokens(model="tiny", messages=history,
                                                                tools=TOOLS).input_tokens


def test_auth_bad_fields_and_bad_bodies_get_anthropic_errors_naming_what_to_fix(server, client):
    url = server.url + "/v1/messages"
    body = {"model": "tiny", "max_tokens": 4, "messages": ASK}
    assert httpx.post(url, json=body, headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"}).status_code == 200
    assert httpx.post(url, json=body, headers={"authorization": f"Bearer {KEY}"}).status_code == 200
    denied = httpx.post(url, json=body, headers={"x-api-key": "wrong"})
    assert denied.status_code == 401 and denied.json()["error"]["type"] == "authentication_error"
    cases = {
        "messages[0].content[0].type": {"messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]},
        "thinking": {"thinking": {"type": "enabled", "budget_tokens": 1024}},
        "container": {"container": "c1"},
        "max_tokens": {"max_tokens": None},
        "tools[0].type": {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
        "tool_choice.disable_parallel_tool_use": {"tools": TOOLS, "tool_choice": {
            "type": "auto", "disable_parallel_tool_use": True}},
        "messages[0].role": {"messages": [{"role": "system", "content": "hi"}]},
        "stop_sequences": {"stop_sequences": ["x" * 2**20]},
        "output_config.effort": {"output_config": {"effort": "high"}},
        "messages[0].content[0].citations": {"messages": [{"role": "user", "content": [
            {"type": "text", "text": "hi", "citations": [{"type": "char_location"}]}]}]},
    }
    for field, change in cases.items():
        r = httpx.post(url, json={**body, **change}, headers={"x-api-key": KEY}, timeout=60)
        error = r.json()
        assert r.status_code == 400 and error["type"] == "error", (field, error)
        assert error["error"]["type"] == "invalid_request_error" and field.split(".")[0] in error["error"]["message"]
    huge = httpx.post(url, content=b'{"messages": "' + b"x" * (17 * 2**20) + b'"}',
                      headers={"x-api-key": KEY, "content-type": "application/json"}, timeout=60)
    assert huge.status_code == 413 and huge.json()["error"]["type"] == "request_too_large"
    bad = httpx.post(url + "/count_tokens", content=b"{not json", headers={"x-api-key": KEY,
                                                                         "content-type": "application/json"})
    assert bad.status_code == 400 and bad.json()["type"] == "error"
    assert client.messages.create(model="tiny", messages=ASK, max_tokens=2).usage.output_tokens == 2  # still serving
