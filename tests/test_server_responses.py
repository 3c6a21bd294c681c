"""The Responses API through the official `openai` client's `responses` against a real `tally serve`: the streamed
`response.*` events come in order and add up to the whole answer; previous_response_id continues a stored
conversation, store: false keeps nothing and the store evicts the least recently used; forced function calls stream
their arguments; logprobs; a cancel ends a response in progress; refused fields are named."""
from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from tally.server.process import ServerProcess

FLAGS = ["--served-model-name", "tiny", "--dtype", "float32", "--max-model-len", "256", "--kv-cache-memory", "8MB",
         "--log-level", "warning", "--responses-store-size", "2"]
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
           "additionalProperties": False}
TOOLS = [{"type": "function", "name": "get_weather", "parameters": WEATHER, "strict": True}]
TEXT_EVENTS = ["response.created", "response.in_progress", "response.output_item.added",
               "response.content_part.added", "response.output_text.delta", "response.output_text.done",
               "response.content_part.done", "response.output_item.done"]


@pytest.fixture(scope="module")
def server(tiny_llama):
    with ServerProcess([str(tiny_llama), *FLAGS]) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=120)


def _events(stream) -> list:
    return list(stream)


def _collapsed(kinds: list[str]) -> list[str]:
    return [k for i, k in enumerate(kinds) if i == 0 or k != kinds[i - 1]]


def test_streamed_events_come_in_order_and_add_up_to_the_whole_response(client):
    kw = dict(model="tiny", input="Hello there", instructions="Be brief.", max_output_tokens=12, temperature=0,
              include=["message.output_text.logprobs"], top_logprobs=2)
    whole = client.responses.create(**kw)
    events = _events(client.responses.create(stream=True, **kw))
    assert _collapsed([e.type for e in events]) == [*TEXT_EVENTS, "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text == final.output_text and whole.status == final.status == "incomplete"
    assert whole.incomplete_details.reason == "max_output_tokens" and whole.usage.output_tokens == 12
    logprobs = whole.output[0].content[0].logprobs
    assert len(logprobs) == 12 and all(len(lp.top_logprobs) == 2 for lp in logprobs)
    assert [lp.token for lp in final.output[0].content[0].logprobs] == [lp.token for lp in logprobs]


def test_previous_response_id_continues_a_stored_conversation_within_the_stores_bounds(client):
    first = client.responses.create(model="tiny", input="Name a colour.", max_output_tokens=6, temperature=0)
    assert client.responses.retrieve(first.id).output_text == first.output_text
    follow = client.responses.create(model="tiny", input=[{"role": "user", "content": "Another?"}],
                                     previous_response_id=first.id, max_output_tokens=4, temperature=0)
    spelled_out = client.responses.create(model="tiny", input=[
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": [{"type": "output_text", "text": first.output_text}]},
        {"role": "user", "content": [{"type": "input_text", "text": "Another?"}]}],
        max_output_tokens=4, temperature=0, store=False)
    assert follow.output_text == spelled_out.output_text  # the same conversation, the same greedy answer
    assert follow.usage.input_tokens == spelled_out.usage.input_tokens
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(spelled_out.id)  # store: false
    client.responses.create(model="tiny", input="x", max_output_tokens=1)  # a size-2 store: `first` is evicted
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        client.responses.create(model="tiny", input="more", previous_response_id=first.id, max_output_tokens=1)


def test_a_forced_function_call_streams_its_arguments_and_its_output_goes_back(client):
    r = client.responses.create(model="tiny", input="Weather in Paris?", tools=TOOLS, tool_choice="required",
                                parallel_tool_calls=False, max_output_tokens=80)
    (call,) = r.output
    assert call.type == "function_call" and call.name == "get_weather" and r.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    events = _events(client.responses.create(model="tiny", input="Weather in Paris?", tools=TOOLS, stream=True,
                                             tool_choice={"type": "function", "name": "get_weather"},
                                             max_output_tokens=80, temperature=1.0))
    kinds = _collapsed([e.type for e in events])
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.function_call_arguments.delta", "response.function_call_arguments.done",
                     "response.output_item.done", "response.completed"]
    pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert "".join(pieces) == events[-1].response.output[0].arguments  # how many pieces is timing (a lagging reader
    # gets several tokens at once): test_server_tools.py::test_arguments_stream_as_the_text_grows holds the pieces
    answer = client.responses.create(model="tiny", max_output_tokens=4, tools=TOOLS, input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"}], tool_choice="none")
    assert answer.output[0].type == "message"


def test_a_cancel_ends_a_response_in_progress(server, client):
    for _ in range(5):  # the tiny model is quick: try again if the answer finished before the cancel came
        with client.responses.create(model="tiny", input="Tell a long story.", max_output_tokens=200,
                                     stream=True) as stream:
            created = next(iter(stream))
            cancel = httpx.post(f"{server.base_url}/responses/{created.response.id}/cancel", timeout=60)
            rest = list(stream)
        if cancel.status_code == 400:
            assert "has finished" in cancel.json()["error"]["message"]
            continue
        assert cancel.status_code == 200 and cancel.json()["status"] == "cancelled"
        assert rest[-1].type == "response.incomplete" and rest[-1].response.status == "cancelled"
        assert client.responses.retrieve(created.response.id).status == "cancelled"
        return
    pytest.fail("every response finished before its cancel arrived")


def test_unsupported_fields_and_bad_bodies_get_400s_naming_them(server, client):
    url = server.base_url + "/responses"
    base = {"model": "tiny", "input": "hi", "max_output_tokens": 2}
    cases = {"background": {"background": True}, "tools[0].type": {"tools": [{"type": "web_search"}]},
             "input[0].content[0].type": {"input": [{"role": "user", "content": [
                 {"type": "input_image", "image_url": "http://x/y.png"}]}]},
             "include": {"include": ["file_search_call.results"]}, "truncation": {"truncation": "auto"},
             "reasoning": {"reasoning": {"effort": "high"}}, "conversation": {"conversation": "c1"},
             "text.format": {"text": {"format": {"type": "xml"}}}, "input[0].type": {"input": [
                 {"type": "item_reference", "id": "x"}]}, "previous_response_id": {"previous_response_id": "nope"},
             "tool_choice": {"tool_choice": "auto", "tools": TOOLS}}  # auto needs the flags
    for field, change in cases.items():
        r = httpx.post(url, json={**base, **change}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, (field, r.text)
    assert httpx.post(url, content=b"[1, 2]", headers={"content-type": "application/json"}).status_code == 400
    assert httpx.post(f"{url}/resp-nope/cancel").status_code == 404
    r = client.responses.create(model="tiny", input="hi", max_output_tokens=1)  # still serving
    finished = httpx.post(f"{url}/{r.id}/cancel")
    assert finished.status_code == 400 and finished.json()["error"]["param"] == "response_id"
