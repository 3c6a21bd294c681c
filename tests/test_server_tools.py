"""Function calling through the official openai client: forced calls (a named function, "required") always parse
and validate; "auto" reads the model's text with the --tool-call-parser (here its text is steered into the
parser's format with a regex constraint, as a random test model never calls on its own); streamed calls arrive
as vLLM sends them, a first delta with the name and then the arguments in pieces that add up to the non-streamed
answer's; a server without --enable-auto-tool-choice says which flags to set."""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from support.servers import started

from tally.server.process import ServerProcess
from tally.server.tools import ToolMode, stream_delta

FLAGS = ["--served-model-name", "tiny", "--dtype", "float32", "--max-model-len", "256", "--kv-cache-memory", "8MB",
         "--log-level", "warning"]
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather forecast",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
             "additionalProperties": False}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
HERMES_CALL = (r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "(Paris|Rome)", "days": [1-3]\}\}'
               r'\n</tool_call>')
LLAMA3_CALLS = (r'\{"name": "get_weather", "parameters": \{"city": "(Paris|Rome)", "days": [1-3]\}\}; '
                r'\{"name": "get_time", "parameters": \{"zone": "(UTC|CET)"\}\}')


def _client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def servers(tiny_llama):
    """Clients of a plain server and of servers with auto tool choice by each parser: hermes, llama3_json."""
    auto = [str(tiny_llama), *FLAGS, "--enable-auto-tool-choice", "--tool-call-parser"]
    with started(ServerProcess([str(tiny_llama), *FLAGS]), ServerProcess([*auto, "hermes"]),
                 ServerProcess([*auto, "llama3_json"])) as s:
        yield tuple(_client(server) for server in s)


def _streamed(client, **kw) -> tuple[str, list[dict], str]:
    content, calls, reason = "", {}, None
    for chunk in client.chat.completions.create(model="tiny", messages=ASK, max_tokens=220, stream=True, **kw):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for c in delta.tool_calls or []:
            calls.setdefault(c.index, {"name": "", "arguments": ""})
            calls[c.index]["name"] += c.function.name or ""
            calls[c.index]["arguments"] += c.function.arguments or ""
        reason = chunk.choices[0].finish_reason or reason
    return content, [calls[i] for i in sorted(calls)], reason


def _stream_calls(client, **kw) -> tuple[str, list[dict], str]:
    """content, and per call index: its id, name, the argument pieces in order, and whether the name came first."""
    content, calls, reason = "", {}, None
    for chunk in client.chat.completions.create(model="tiny", messages=ASK, max_tokens=220, stream=True, **kw):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for c in delta.tool_calls or []:
            call = calls.setdefault(c.index, {"id": None, "name": None, "pieces": [], "name_first": False})
            if c.id is not None:
                assert call["id"] is None and c.type == "function"  # one header per call
                call.update(id=c.id, name=c.function.name, name_first=not call["pieces"])
            if c.function and c.function.arguments:
                call["pieces"].append(c.function.arguments)
        reason = chunk.choices[0].finish_reason or reason
    return content, [calls[i] for i in sorted(calls)], reason


@pytest.mark.parametrize("parser, steer", [("hermes", "Sure\\. " + HERMES_CALL + "\\n" + HERMES_CALL),
                                           ("llama3_json", LLAMA3_CALLS)])
def test_streamed_calls_send_the_name_first_and_arguments_that_add_up_to_the_non_streamed_answer(servers, parser, steer):
    client = servers[1] if parser == "hermes" else servers[2]
    kw = {"tools": TOOLS, "temperature": 0, "extra_body": {"structured_outputs": {"regex": steer}}}
    whole = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=220, **kw).choices[0]
    content, calls, reason = _stream_calls(client, **kw)
    assert reason == whole.finish_reason == "tool_calls" and len(whole.message.tool_calls) == 2
    assert content.strip() == (whole.message.content or "")
    for streamed, call in zip(calls, whole.message.tool_calls, strict=True):
        assert streamed["name"] == call.function.name and streamed["name_first"]
        assert streamed["id"].startswith("call_") and streamed["id"] != call.id
        assert "".join(streamed["pieces"]) == call.function.arguments  # character for character
        assert json.loads("".join(streamed["pieces"])) == json.loads(call.function.arguments)
        # How many pieces is timing: a reader that lags the engine gets the latest text, several tokens in one
        # event; that arguments stream as the text grows is test_arguments_stream_as_the_text_grows.
    assert len({c["id"] for c in calls}) == 2


def test_a_named_function_is_called_with_arguments_that_validate(servers):
    plain, _, _ = servers
    choice = {"type": "function", "function": {"name": "get_weather"}}
    for temperature in (0.0, 1.0):
        r = plain.chat.completions.create(model="tiny", messages=ASK, max_tokens=80, tools=TOOLS, tool_choice=choice,
                                          temperature=temperature)
        call = r.choices[0].message.tool_calls[0]
        assert call.function.name == "get_weather" and r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    content, calls, reason = _streamed(plain, tools=TOOLS, tool_choice=choice, temperature=1.0, seed=5)
    r = plain.chat.completions.create(model="tiny", messages=ASK, max_tokens=220, tools=TOOLS, tool_choice=choice,
                                      temperature=1.0, seed=5)
    assert content == "" and reason == "stop" and [c["name"] for c in calls] == ["get_weather"]
    assert calls[0]["arguments"] == r.choices[0].message.tool_calls[0].function.arguments


def test_required_gives_one_or_more_calls_of_the_tools_given(servers):
    plain, _, _ = servers
    r = plain.chat.completions.create(model="tiny", messages=ASK, max_tokens=120, tools=TOOLS,
                                      tool_choice="required", temperature=1.0, seed=3)
    calls = r.choices[0].message.tool_calls
    assert calls and r.choices[0].finish_reason == "tool_calls"
    for call in calls:
        params = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == call.function.name)
        jsonschema.validate(json.loads(call.function.arguments), params)
    assert len({c.id for c in calls}) == len(calls)


def test_auto_needs_the_servers_flags(servers):
    plain, _, _ = servers
    with pytest.raises(openai.BadRequestError, match="--enable-auto-tool-choice and --tool-call-parser"):
        plain.chat.completions.create(model="tiny", messages=ASK, max_tokens=4, tools=TOOLS)
    r = plain.chat.completions.create(model="tiny", messages=ASK, max_tokens=4, tools=TOOLS, tool_choice="none")
    assert r.choices[0].message.tool_calls is None


def test_auto_parses_hermes_calls_with_content_before_them_streamed_and_not(servers):
    _, auto, _ = servers
    steer = {"structured_outputs": {"regex": "Sure\\. " + HERMES_CALL + "\\n" + HERMES_CALL}}  # two calls
    r = auto.chat.completions.create(model="tiny", messages=ASK, max_tokens=220, tools=TOOLS, extra_body=steer)
    message = r.choices[0].message
    assert message.content == "Sure." and r.choices[0].finish_reason == "tool_calls"
    assert [c.function.name for c in message.tool_calls] == ["get_weather", "get_weather"]
    for call in message.tool_calls:
        jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    content, calls, reason = _streamed(auto, tools=TOOLS, extra_body=steer, temperature=0)
    assert content.strip() == "Sure." and reason == "tool_calls" and len(calls) == 2
    assert all(json.loads(c["arguments"])["city"] in ("Paris", "Rome") for c in calls)
    plain_text = auto.chat.completions.create(model="tiny", messages=ASK, max_tokens=30, tools=TOOLS,
                                              extra_body={"structured_outputs": {"regex": "No call here"}})
    assert plain_text.choices[0].message.content == "No call here"
    assert plain_text.choices[0].message.tool_calls is None and plain_text.choices[0].finish_reason == "stop"


def test_a_conversation_with_calls_and_tool_results_renders(servers):
    _, auto, _ = servers
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": '{"city": "Paris", "days": 1}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"forecast": "sun"}'}]
    r = auto.chat.completions.create(model="tiny", messages=history, max_tokens=4, tools=TOOLS, tool_choice="none")
    assert r.choices[0].finish_reason in ("stop", "length")


def test_the_parsers_read_their_formats():
    hermes = ToolMode("auto", "hermes")
    text = 'Let me check.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n' \
           '<tool_call>{"name": "g", "arguments": {}}</tool_call>'
    content, calls = hermes.parse(text)
    assert content == "Let me check." and [(c.name, json.loads(c.arguments)) for c in calls] == [("f", {"a": 1}),
                                                                                                 ("g", {})]
    assert hermes.view("Let me check.\n<tool_", final=False).content == "Let me check.\n"  # a possible tag waits
    assert hermes.parse("no calls")[1] == [] and hermes.parse("<tool_call>{broken</tool_call>")[1] == []
    llama = ToolMode("auto", "llama3_json")
    content, calls = llama.parse('{"name": "f", "parameters": {"x": "y"}}; {"name": "g", "parameters": {}}')
    assert content is None and [c.name for c in calls] == ["f", "g"] and json.loads(calls[0].arguments) == {"x": "y"}
    assert llama.view('{"name"', final=False).content == "" and llama.view("Hello", final=False).content == "Hello"


STREAM_CASES = [
    (ToolMode("auto", "hermes"), 'Hi <tool_call>\n{"name": "f", "arguments": {"a": [1, {"b": "}]\\"x"}]}}\n</tool_call>'
                                 '<tool_call>{"arguments": {"late": true}, "name": "g"}</tool_call>'),
    (ToolMode("auto", "llama3_json"), '{"name": "f", "parameters": {"x": "y"}}; {"name": "g", "parameters": {}}'),
    (ToolMode("required", None), '[{"name": "f", "parameters": {"zone": "UTC"}}, {"name": "g", "parameters": {}}]'),
    (ToolMode("named", None, "f"), ' {"city": "Rome", "days": 3} \n'),
]


@pytest.mark.parametrize("mode, text", STREAM_CASES)
def test_stream_deltas_add_up_to_the_parse_wherever_the_text_is_cut(mode, text):
    """Every cut of the text into two chunks: content and each call's arguments join to the non-streamed parse."""
    content, expected = mode.parse(text)
    for cut in range(len(text) + 1):
        joined, args, names = "", {}, {}
        for before, now, final in (("", text[:cut], False), (text[:cut], text, True)):
            piece, deltas, called = stream_delta(mode, before, now, final)
            joined += piece
            for d in deltas:
                names[d["index"]] = d.get("function", {}).get("name", names.get(d["index"]))
                args[d["index"]] = args.get(d["index"], "") + d.get("function", {}).get("arguments", "")
        assert called and (joined.strip() or None) == content
        assert [(names[i], args[i]) for i in sorted(args)] == [(c.name, c.arguments) for c in expected], cut


@pytest.mark.parametrize("mode, text", STREAM_CASES)
def test_arguments_stream_as_the_text_grows(mode, text):
    """Fed a character at a time, a call's arguments leave in pieces before its text is done, not at its end
    (unless they come before the call's name, which must be sent first)."""
    pieces: dict[int, list[str]] = {}
    for n in range(1, len(text) + 1):
        for d in stream_delta(mode, text[:n - 1], text[:n], final=n == len(text))[1]:
            if "arguments" in d.get("function", {}):
                pieces.setdefault(d["index"], []).append(d["function"]["arguments"])
    for i, call in enumerate(mode.parse(text)[1]):
        assert "".join(pieces[i]) == call.arguments
        name_after = text.find(call.arguments) < text.find(f'"{call.name}"')
        assert len(pieces[i]) > 1 or len(call.arguments) <= 2 or name_after, (i, pieces[i])
