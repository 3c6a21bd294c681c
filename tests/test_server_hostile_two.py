"""Hostile requests, round two, against a real `tally serve`: a schema or choice that is costly to compile is
compiled off the engine thread while others are served, or refused with a 400 naming the limit (never the grammar
engine's panic); a request cannot fan out past what one request may ask for; malformed tool fields, JSON nested
deep inside strings and context-long min_tokens are 400s naming the field; echoed values come back clipped; and
--allowed-hosts matches host:port entries and warns about the ones it never can."""
from __future__ import annotations

import json
import threading

import httpx
import pytest
from support.ledger_polling import expect_ledger, idle
from support.servers import started

from tally.engine.grammar_limits import MAX_OBJECT_PROPERTIES, GrammarLimits
from tally.server.process import ServerProcess

MODEL = "tiny"
SLOTS = 8
LIMITS = GrammarLimits()
DEEP = "[" * 150_000 + "]" * 150_000  # JSON text nested far past any bound, inside a string field


def _args(ckpt, *flags: str) -> list[str]:
    return ["--model", str(ckpt), "--served-model-name", MODEL, "--dtype", "float32", "--max-model-len", "256",
            "--kv-cache-memory", "8MB", "--log-level", "warning", *flags]


@pytest.fixture(scope="module")
def servers(tiny_llama):
    """A plain server, and a strict one: a compile time limit no real grammar compiles within, and --allowed-hosts
    with a port: its own port (how the test and the readiness probe reach it), another port, and an entry that is
    no host at all. Started side by side."""
    strict = ServerProcess(_args(tiny_llama, "--structured-outputs-config", '{"compile_timeout_s": 0.001}'))
    strict.args += ["--allowed-hosts", f"127.0.0.1:{strict.port},localhost:1,http://example.com/"]
    with started(ServerProcess(_args(tiny_llama, "--max-num-seqs", str(SLOTS))), strict) as pair:
        yield pair


@pytest.fixture(scope="module")
def server(servers):
    return servers[0]


@pytest.fixture(scope="module")
def strict(servers):
    return servers[1]


def _chat(**fields) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **fields}


def _post(server: ServerProcess, body: dict | str, path: str = "/v1/chat/completions", **headers) -> httpx.Response:
    content = body if isinstance(body, str) else json.dumps(body)
    return httpx.post(server.url + path, content=content, timeout=120,
                      headers={"content-type": "application/json", **headers})


def _schema(num_properties: int) -> dict:
    return {"type": "object", "properties": {f"p{i}": {"type": "string", "maxLength": 2}
                                             for i in range(num_properties)}}


def _json_schema(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "big", "schema": schema}}


def _assistant_call(function) -> list:
    return [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                                                                  "function": function}]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"}]


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
REFUSED = {
    # name: (body, the field the 400 must name)
    "tool_choice.function a string": (_chat(tools=[TOOL], tool_choice={"type": "function", "function": "f"}),
                                      "tool_choice.function"),
    "tool_choice's function.name a list": (_chat(tools=[TOOL], tool_choice={"type": "function",
                                                                            "function": {"name": ["f"]}}),
                                           "tool_choice.function"),
    "tool_choice's function.name an object": (_chat(tools=[TOOL], tool_choice={"type": "function",
                                                                               "function": {"name": {"n": 1}}}),
                                              "tool_choice.function"),
    "a tool's function.name a list": (_chat(tools=[{"type": "function", "function": {"name": ["f"]}}],
                                            tool_choice="required"), "tools"),
    "an assistant call's function a string": (_chat(messages=_assistant_call("f")),
                                              "messages[1].tool_calls[0].function"),
    "an assistant call's function null": (_chat(messages=_assistant_call(None)),
                                          "messages[1].tool_calls[0].function"),
    "an assistant call's function a list": (_chat(messages=_assistant_call(["f"])),
                                            "messages[1].tool_calls[0].function"),
    "tool-call arguments nested 150,000 deep": (_chat(messages=_assistant_call({"name": "f", "arguments": DEEP})),
                                                "messages[1].tool_calls[0].function.arguments"),
    "guided_json nested 150,000 deep": (_chat(guided_json=DEEP), "structured_outputs"),
    "structured_outputs json nested 150,000 deep": (_chat(structured_outputs={"json": DEEP}), "structured_outputs"),
    "response_format's schema a deep string": (_chat(response_format=_json_schema(DEEP)), "response_format"),
    "min_tokens past the context": (_chat(max_tokens=None, min_tokens=1000), "min_tokens"),
    "a schema past max_properties": (_chat(response_format=_json_schema(_schema(LIMITS.max_properties + 1))),
                                     "structured_outputs"),
    "an object past what the grammar engine holds": (
        _chat(response_format=_json_schema(_schema(MAX_OBJECT_PROPERTIES + 1))), "structured_outputs"),
    "a choice of 100,000 strings": (_chat(structured_outputs={"choice": [str(i) for i in range(100_000)]}),
                                    "structured_outputs"),
    "2,000 prompts x n 8": ({"model": MODEL, "prompt": [[1, 2, 3]] * 2000, "n": 8, "max_tokens": 2}, "prompt"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_each_case_is_a_400_naming_the_field_without_internals(server, name):
    body, field = REFUSED[name]
    r = _post(server, body, "/v1/completions" if "prompt" in body else "/v1/chat/completions")
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert field in str(error["param"]) + " " + error["message"], error
    assert not any(word in r.text.lower() for word in ("panic", "backtrace", "traceback", "recursion")), r.text
    assert len(error["message"]) < 600, error["message"]  # says what to fix; echoes nothing whole


def test_limits_name_the_key_that_raises_them(server):
    for body, key in ((REFUSED["a schema past max_properties"][0], "max_properties"),
                      (REFUSED["a choice of 100,000 strings"][0], "max_choices"),
                      (REFUSED["2,000 prompts x n 8"][0], "--max-num-seqs")):
        r = _post(server, body, "/v1/completions" if "prompt" in body else "/v1/chat/completions")
        assert key in r.json()["error"]["message"], r.text


def test_an_echoed_model_name_comes_back_clipped(server):
    r = _post(server, _chat(model="m" * 100_000))
    assert r.status_code == 404, r.text
    message = r.json()["error"]["message"]
    assert "`" + "m" * 100 + "…` does not exist" in message and len(message) < 400, message


def test_a_big_schema_at_n_16_compiles_while_a_request_behind_it_finishes(server):
    """The largest schema the limits admit takes seconds to compile, once for its 16 samples, on a thread beside the
    engine: a request sent while it compiles finishes first."""
    big = _chat(response_format=_json_schema(LIMITS.largest_schema()), n=16, max_tokens=4)
    finished: list[str] = []

    def send_big() -> None:
        r = _post(server, big)
        finished.append(f"big {r.status_code}")

    sender = threading.Thread(target=send_big)
    sender.start()
    try:
        # its 16 sequences wait for their grammar beyond the 8 batch slots
        expect_ledger(server, lambda led: led["requests"]["queued"] >= 16 - SLOTS, "the big request admitted")
        r = _post(server, _chat())
        finished.append(f"normal {r.status_code}")
    finally:
        sender.join(120)
    assert finished == ["normal 200", "big 200"]
    expect_ledger(server, idle, "every request done")


def test_a_client_gone_while_its_grammar_compiles_leaves_nothing_behind(server):
    body = _chat(response_format=_json_schema(LIMITS.largest_schema("another")), n=2 * SLOTS)
    try:
        r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=0.5)
        assert r.status_code == 200, r.text  # only a CPU that compiles it within half a second gets here
    except httpx.TimeoutException:
        pass  # the client left while the grammar compiled (its sequences past the slots count as queued)
    expect_ledger(server, idle, "nothing compiling, queued or running")
    assert _post(server, _chat()).status_code == 200


def test_a_request_may_fill_the_batch_slots_many_times_over_up_to_its_cap(server):
    r = _post(server, {"model": MODEL, "prompt": [[1, 2, 3]] * 4, "n": 32, "max_tokens": 2}, "/v1/completions")
    assert r.status_code == 200 and len(r.json()["choices"]) == 128, r.text
    r = _post(server, {"model": MODEL, "prompt": [[1, 2, 3]] * 2, "n": 65, "max_tokens": 2}, "/v1/completions")
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text


def test_a_grammar_slower_than_the_time_limit_is_a_400_naming_it(strict):
    r = _post(strict, _chat(response_format=_json_schema(LIMITS.largest_schema())), host=f"127.0.0.1:{strict.port}")
    assert r.status_code == 400, r.text
    assert "compile_timeout_s" in r.json()["error"]["message"]
    ok = _post(strict, _chat(), host=f"127.0.0.1:{strict.port}")
    assert ok.status_code == 200, ok.text


def test_allowed_hosts_match_host_and_port_and_warn_about_entries_they_never_can(strict):
    assert _post(strict, _chat(), host=f"127.0.0.1:{strict.port}").status_code == 200
    for foreign in ("127.0.0.1", f"localhost:{strict.port}", "127.0.0.1:1", "example.com"):
        r = _post(strict, _chat(), host=foreign)
        assert r.status_code == 400 and r.text == "Invalid host header", (foreign, r.text)
    log = strict.log()
    assert "'localhost:1' names port 1" in log and "'http://example.com/' can never match" in log, log
    assert "Traceback" not in log


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"model": MODEL, "prompt": "word " * 400_000, "max_tokens": 1}),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "word " * 400_000}]}),
])
def test_a_text_no_context_could_hold_is_refused_before_it_is_tokenized(server, path, body):
    """Tokenizing holds the GIL for the text's whole length: a text far past the context is refused unread."""
    r = _post(server, body, path)
    assert r.status_code == 400 and "characters, more than a context of" in r.json()["error"]["message"], r.text


def test_truncate_prompt_tokens_reads_only_the_end_of_a_long_prompt(server):
    r = _post(server, {"model": MODEL, "prompt": "word " * 400_000, "max_tokens": 1, "truncate_prompt_tokens": 8},
              "/v1/completions")
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 8, r.text
