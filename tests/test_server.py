"""`tally serve` on a tiny checkpoint, driven by the official openai client over real HTTP."""
from __future__ import annotations

import asyncio
import json
import re
import socket

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.ledger_polling import ledger, wait_for_ledger
from support.servers import started
from support.tiny_models import make_checkpoint

from tally import LLM
from tally.sampling_params import SamplingParams
from tally.server.process import ServerProcess

MODEL = "tiny"
PROMPTS = ["The quick brown fox", "def add(a, b):", "Paris is the capital of", "Numbers: 0 1 2"]


# A context so long that a request filling it runs for many seconds on any CPU (each decode step is a forward
# pass, so tens of thousands of steps): the disconnect tests leave such a request while the server's
# own counters show it generating, instead of guessing from a timer how far it got.
LONG_LEN = 65536


@pytest.fixture(scope="module")
def servers(tiny_llama, tmp_path_factory):
    long_ckpt = make_checkpoint(tmp_path_factory.mktemp("tiny-64k"), "llama", max_position_embeddings=LONG_LEN)
    with started(ServerProcess(["--model", str(tiny_llama), "--served-model-name", MODEL, "--dtype", "float32",
                                "--kv-cache-memory", "8MB", "--max-body-bytes", "64KB"]),
                 ServerProcess(["--model", str(long_ckpt), "--served-model-name", MODEL, "--dtype", "float32",
                                "--kv-cache-memory", "48MB", "--max-model-len", str(LONG_LEN)])) as pair:
        yield pair


@pytest.fixture(scope="module")
def server(servers):
    return servers[0]


@pytest.fixture(scope="module")
def long_server(servers):
    return servers[1]


@pytest.fixture(scope="module")
def offline(tiny_llama):
    return LLM(str(tiny_llama), dtype="float32", kv_cache_memory=8_000_000)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)


def greedy(offline: LLM, prompts: list[str], max_tokens: int) -> list[str]:
    outs = offline.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens))
    return [o.outputs[0].text for o in outs]


def wait_for_idle_pool(server) -> dict:
    """The pool as soon as no request holds a block (aborts free theirs before the next step)."""
    return wait_for_ledger(server, lambda led: led["kv"]["blocks_used"] == 0 and led["requests"]["running"] == 0)


def wait_for_generation(server, min_tokens: int = 48) -> dict:
    """Waits until the server's one running request holds KV for at least `min_tokens` tokens: it is
    past its prompt and generating. Fails if that never happens."""
    def generating(led: dict) -> bool:
        kv = led["kv"]
        return led["requests"]["running"] == 1 and kv["blocks_used"] * kv["block_size_tokens"] >= min_tokens

    led = wait_for_ledger(server, generating)
    assert generating(led), f"the request never showed progress: {led['requests']}, {led['kv']}"
    return led


# -- generation ---------------------------------------------------------------------------------
def test_completion_matches_offline_greedy_with_usage(client, offline):
    r = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=10, temperature=0)
    assert r.choices[0].text == greedy(offline, PROMPTS[:1], 10)[0]
    assert r.choices[0].finish_reason == "length"
    n_prompt = len(offline.get_tokenizer().encode(PROMPTS[0]))
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (n_prompt, 10)
    assert r.usage.total_tokens == n_prompt + 10
    assert r.usage.prompt_tokens_details.cached_tokens >= 0


def test_streamed_completion_equals_non_streamed_and_ends_with_usage(client):
    kwargs = dict(model=MODEL, prompt=PROMPTS[1], max_tokens=12, temperature=0)
    full = client.completions.create(**kwargs).choices[0].text
    chunks = list(client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12


def test_token_id_prompts_and_prompt_lists_give_one_choice_each(client, offline):
    ids = offline.get_tokenizer().encode(PROMPTS[2])
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=6, temperature=0)
    assert by_ids.choices[0].text == greedy(offline, PROMPTS[2:3], 6)[0]
    batch = client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=6, temperature=0)
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert [c.text for c in batch.choices] == greedy(offline, PROMPTS, 6)


def test_chat_applies_template_to_system_and_text_parts(client, offline):
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": [{"type": "text", "text": "Name a "}, {"type": "text", "text": "city."}]}]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
    plain = [messages[0], {"role": "user", "content": "Name a city."}]
    expected = offline.chat(plain, SamplingParams(temperature=0, max_tokens=8))[0]
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == expected.outputs[0].text
    assert r.usage.prompt_tokens == len(expected.prompt_token_ids)
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected.outputs[0].text
    assert chunks[-1].usage.prompt_tokens == r.usage.prompt_tokens


def test_chat_logprobs_carry_top_alternatives(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                       temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == 4
    for tok in content:
        assert len(tok.top_logprobs) == 3
        assert tok.logprob == pytest.approx(tok.top_logprobs[0].logprob)  # greedy picks the top one


def test_stop_string_cuts_the_text_in_both_modes(client, offline):
    text = greedy(offline, PROMPTS[:1], 24)[0]
    stop = next(text[i:i + 2] for i in range(3, len(text) - 2)
                if text[i:i + 2].isprintable() and "\ufffd" not in text[i:i + 2] and text.find(text[i:i + 2]) == i)
    kwargs = dict(model=MODEL, prompt=PROMPTS[0], max_tokens=24, temperature=0, stop=[stop])
    r = client.completions.create(**kwargs)
    assert r.choices[0].text == text[:text.find(stop)]
    assert r.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(**kwargs, stream=True))
    assert streamed == r.choices[0].text


def test_n_samples_are_reproducible_with_a_seed(client):
    kwargs = dict(model=MODEL, prompt=PROMPTS[3], max_tokens=8, temperature=1.0, n=3)
    a = client.completions.create(**kwargs, seed=7)
    b = client.completions.create(**kwargs, seed=7)
    c = client.completions.create(**kwargs, seed=8)
    assert [x.index for x in a.choices] == [0, 1, 2]
    assert [x.text for x in a.choices] == [x.text for x in b.choices]
    assert [x.text for x in a.choices] != [x.text for x in c.choices]
    assert a.usage.completion_tokens == 24


def test_echo_with_logprobs_and_no_new_tokens_scores_the_prompt(client, offline):
    # What lm-evaluation-harness's local-completions sends for loglikelihood.
    r = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=0, echo=True, logprobs=1,
                                  temperature=0)
    ref = offline.generate(PROMPTS[0], SamplingParams(max_tokens=1, prompt_logprobs=1, temperature=0))[0]
    lp = r.choices[0].logprobs
    assert r.choices[0].text == PROMPTS[0]
    assert len(lp.tokens) == len(ref.prompt_token_ids) and lp.token_logprobs[0] is None
    expected = [entry[tid].logprob for tid, entry in zip(ref.prompt_token_ids[1:], ref.prompt_logprobs[1:])]
    assert lp.token_logprobs[1:] == pytest.approx(expected, abs=1e-4)
    assert all(len(top) >= 1 for top in lp.top_logprobs[1:])
    assert r.usage.completion_tokens == 0
    one = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=1, echo=True, logprobs=1,
                                    temperature=0)
    assert len(one.choices[0].logprobs.tokens) == len(ref.prompt_token_ids) + 1


def test_constraints_from_every_field_vllm_and_openai_use(client):
    """The plumbing (the outputs themselves are checked in tests/test_structured_outputs.py and, for JSON, on the
    built-in model in tests/test_server_builtin.py)."""
    chat = [{"role": "user", "content": "hi"}]
    r = client.chat.completions.create(model=MODEL, messages=chat, max_tokens=20,
                                       extra_body={"guided_choice": ["a b", "c"]})
    assert r.choices[0].message.content in ("a b", "c")
    r = client.completions.create(model=MODEL, prompt="hi", max_tokens=20,
                                  extra_body={"structured_outputs": {"regex": "[0-9]{3}"}})
    assert re.fullmatch("[0-9]{3}", r.choices[0].text)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt="hi", max_tokens=20, stream=True, extra_body={"guided_regex": "(yes|no)!"}))
    assert streamed in ("yes!", "no!")
    with pytest.raises(openai.BadRequestError, match="one constraint at a time"):
        client.chat.completions.create(model=MODEL, messages=chat, max_tokens=2,
                                       response_format={"type": "json_object"}, extra_body={"guided_regex": "a"})
    with pytest.raises(openai.BadRequestError, match="regex is not valid") as e:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=2, extra_body={"guided_regex": "[a-"})
    assert _error(e.value)["param"] == "structured_outputs"
    with pytest.raises(openai.BadRequestError, match="json_schema needs"):
        client.chat.completions.create(model=MODEL, messages=chat, max_tokens=2,
                                       response_format={"type": "json_schema", "json_schema": {"name": "x"}})


# -- errors -------------------------------------------------------------------------------------
def _error(exc: openai.APIStatusError) -> dict:
    return exc.response.json()["error"]


def test_prompt_longer_than_context_is_400_naming_both_lengths(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=list(range(5, 305)), max_tokens=4)
    err = _error(e.value)
    assert "300" in err["message"] and "256" in err["message"] and err["param"] == "prompt"
    assert err["type"] == "invalid_request_error" and err["code"] == 400


@pytest.mark.parametrize("bad, param", [({"temperature": -1}, "temperature"), ({"max_tokens": 1000}, "max_tokens"),
                                        ({"top_p": 0}, "top_p"), ({"n": 0}, "n"), ({"logprobs": 50}, "logprobs")])
def test_invalid_parameters_are_400_naming_the_parameter(client, bad, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="hi", **bad)
    assert _error(e.value)["param"] == param


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-9", prompt="hi", max_tokens=2)
    assert "tiny" in _error(e.value)["message"]


def test_oversized_body_is_413_and_malformed_bodies_are_400(server):
    big = httpx.post(server.base_url + "/completions", json={"model": MODEL, "prompt": "x" * 70_000})
    assert big.status_code == 413 and big.json()["error"]["code"] == 413
    bad_json = httpx.post(server.base_url + "/completions", content=b"{not json",
                          headers={"content-type": "application/json"})
    assert bad_json.status_code == 400 and "JSON" in bad_json.json()["error"]["message"]
    missing = httpx.post(server.base_url + "/chat/completions", json={"model": MODEL})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "messages"


# -- concurrency, disconnects, the pool ---------------------------------------------------------
def test_64_concurrent_streams_match_offline_greedy_and_leak_no_blocks(server, offline):
    prompts = [f"{PROMPTS[i % 4]} {i}" for i in range(64)]
    expected = greedy(offline, prompts, 8)

    async def one(client: openai.AsyncOpenAI, prompt: str) -> str:
        stream = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0,
                                                 stream=True)
        return "".join([c.choices[0].text async for c in stream if c.choices])

    async def all_of_them() -> list[str]:
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0,
                                      timeout=300) as client:
            return await asyncio.gather(*(one(client, p) for p in prompts))

    assert asyncio.run(all_of_them()) == expected
    led = ledger(server)
    assert led["kv"]["blocks_used"] == 0 and led["requests"] == {"running": 0, "waiting": 0, "queued": 0}


def _outcomes(server) -> dict[str, float]:
    """tally:request_success_total by finished_reason."""
    out: dict[str, float] = {}
    for k, v in _metrics(server).items():
        if k.startswith("tally:request_success_total{"):
            reason = json.loads(k[len("tally:request_success_total"):])["finished_reason"]
            out[reason] = out.get(reason, 0.0) + v
    return out


def _aborted(server) -> float:
    return _outcomes(server).get("abort", 0.0)


def _long_body(prompt: str, **extra) -> dict:
    """A request that fills the long server's context: it cannot end before the client leaves."""
    return {"model": MODEL, "prompt": prompt, "max_tokens": LONG_LEN - 64, "ignore_eos": True, **extra}


def _assert_aborted_and_freed(server, before: dict[str, float]) -> None:
    led = wait_for_idle_pool(server)
    assert led["kv"]["blocks_used"] == 0 and led["requests"]["running"] == 0
    after = _outcomes(server)
    assert after.get("abort", 0.0) == before.get("abort", 0.0) + 1
    assert after.get("length", 0.0) == before.get("length", 0.0)  # it did not run to its end


def test_client_disconnect_mid_stream_aborts_and_frees_blocks(long_server):
    before = _outcomes(long_server)
    body = _long_body(PROMPTS[0], stream=True)
    with httpx.stream("POST", long_server.base_url + "/completions", json=body, timeout=120) as r:
        lines = r.iter_lines()
        while not next(lines).startswith("data: "):
            pass
        wait_for_generation(long_server)
    # Leaving the `with` closed the connection mid-stream.
    _assert_aborted_and_freed(long_server, before)


def test_client_leaving_a_non_streamed_request_aborts_it(long_server):
    before = _outcomes(long_server)
    payload = json.dumps(_long_body(PROMPTS[1])).encode()
    with socket.create_connection(("127.0.0.1", long_server.port), timeout=120) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
        wait_for_generation(long_server)
        sock.setblocking(False)
        with pytest.raises(BlockingIOError):  # no answer yet: the request is still running
            sock.recv(1)
    # The client closed the connection without reading an answer.
    _assert_aborted_and_freed(long_server, before)


def test_one_bad_request_does_not_disturb_others(server, offline):
    async def run() -> list:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as c:
            good = c.post("/completions", json={"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 8,
                                                "temperature": 0})
            bad = [c.post("/completions", json={"model": MODEL, "prompt": list(range(300)), "max_tokens": 4}),
                   c.post("/completions", json={"model": MODEL, "prompt": [99999], "max_tokens": 4}),
                   c.post("/chat/completions", json={"model": MODEL, "messages": [{"role": "user"}], "n": -1})]
            return await asyncio.gather(good, *bad)

    good, *bad = asyncio.run(run())
    assert good.json()["choices"][0]["text"] == greedy(offline, PROMPTS[:1], 8)[0]
    assert [b.status_code for b in bad] == [400, 400, 400]
    assert httpx.get(server.url + "/health").status_code == 200


# -- side endpoints -----------------------------------------------------------------------------
def test_models_health_tokenize_detokenize(server, client, offline):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(server.url + "/health").status_code == 200
    tok = httpx.post(server.url + "/tokenize", json={"prompt": PROMPTS[0]}).json()
    assert tok["tokens"] == offline.get_tokenizer().encode(PROMPTS[0]) and tok["count"] == len(tok["tokens"])
    assert tok["max_model_len"] == 256
    back = httpx.post(server.url + "/detokenize", json={"tokens": tok["tokens"]}).json()
    assert back["prompt"] == PROMPTS[0]
    chat = httpx.post(server.url + "/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["count"] > 3
    assert httpx.post(server.url + "/detokenize", json={"tokens": [10**6]}).status_code == 400


def test_ledger_reports_the_pool_and_the_plan(server):
    led = ledger(server)
    assert led["model"] == MODEL and led["weights_bytes"] > 0
    kv = led["kv"]
    assert kv["blocks_total"] == led["plan"]["kv_blocks"] and kv["bytes_per_token"] > 0
    assert kv["blocks_used"] + kv["blocks_free"] == kv["blocks_total"]
    assert 0.0 <= led["prefix_cache"]["hit_rate"] <= 1.0


def _metrics(server) -> dict[str, float]:
    text = httpx.get(server.url + "/metrics").text
    values = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = s.name + json.dumps(dict(sorted(s.labels.items())))
            values[key] = s.value
    return values


def _total(values: dict[str, float], name: str) -> float:
    return sum(v for k, v in values.items() if k.startswith(name + "{"))


def test_metrics_parse_and_request_outcomes_add_up(server, client):
    before = _metrics(server)
    sent = 0
    for prompt in PROMPTS[:3]:
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=3)
        sent += 1
    list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                        stream=True))
    sent += 1
    for bad in (dict(model="nope"), dict(model=MODEL, temperature=-2)):
        with pytest.raises(openai.APIStatusError):
            client.completions.create(prompt="hi", max_tokens=2, **bad)
        sent += 1
    after = _metrics(server)

    def delta(name: str) -> float:
        return _total(after, name) - _total(before, name)

    outcomes = ["tally:request_success_total", "tally:request_rejected_total", "tally:request_error_total",
                "tally:request_timeout_total"]
    assert sum(delta(n) for n in outcomes) == sent
    assert delta("tally:request_error_total") == 2
    assert delta("tally:time_to_first_token_seconds_count") == 4
    assert delta("tally:generation_tokens_total") == 12
    for name in ("tally:e2e_request_latency_seconds_count", "tally:request_queue_time_seconds_count",
                 "tally:inter_token_latency_seconds_count", "tally:request_prompt_tokens_count",
                 "tally:num_requests_running", "tally:kv_cache_usage_perc", "tally:kv_cache_fragmentation_perc",
                 "tally:prefix_cache_queries_total", "tally:num_preemptions_total", "process_resident_memory_bytes"):
        assert any(k.startswith(name + "{") for k in after), name


def test_logit_bias_allowed_token_ids_and_truncate_prompt_tokens(client, server):
    token = httpx.post(server.url + "/tokenize", json={"prompt": "hello"}).json()["tokens"][-1]
    biased = client.completions.create(model=MODEL, prompt="hi", max_tokens=3, temperature=0,
                                       logit_bias={str(token): 100})
    only = client.completions.create(model=MODEL, prompt="hi", max_tokens=3, temperature=1.0,
                                     extra_body={"allowed_token_ids": [token]})
    assert biased.choices[0].text == only.choices[0].text and biased.usage.completion_tokens == 3
    cut = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=1,
                                    extra_body={"truncate_prompt_tokens": 3})
    assert cut.usage.prompt_tokens == 3
    with pytest.raises(openai.BadRequestError, match="outside the vocabulary"):
        client.completions.create(model=MODEL, prompt="hi", max_tokens=1, logit_bias={"99999999": 1})


def test_continuous_usage_stats_put_the_count_so_far_in_every_chunk(client):
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=6, temperature=0, stream=True,
                                            stream_options={"include_usage": True, "continuous_usage_stats": True}))
    counted = [c.usage.completion_tokens for c in chunks if c.choices]
    assert counted == sorted(counted) and counted[-1] == chunks[-1].usage.completion_tokens == 6
    assert all(c.usage.prompt_tokens == chunks[-1].usage.prompt_tokens for c in chunks)


def test_chat_echo_starts_the_answer_with_the_assistants_last_message(client):
    convo = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Well,"}]
    kw = dict(model=MODEL, messages=convo, max_tokens=4, temperature=0,
              extra_body={"echo": True, "continue_final_message": True, "add_generation_prompt": False})
    whole = client.chat.completions.create(**kw).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**kw, stream=True))
    plain = client.chat.completions.create(**{**kw, "extra_body": {"continue_final_message": True,
                                                                   "add_generation_prompt": False}})
    assert whole == streamed == "Well," + plain.choices[0].message.content
