"""`tally serve` with no --model serves the built-in SmolLM2 and answers chat like the offline engine."""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tally import LLM
from tally.sampling_params import SamplingParams
from tally.server.process import ServerProcess

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"}]}]
ENGINE_ARGS = dict(max_model_len=1024, kv_cache_memory=64_000_000)


def test_builtin_model_chat_matches_offline_greedy_streamed_and_not():
    with ServerProcess(["--max-model-len", "1024", "--kv-cache-memory", "64MB"]) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=300)
        model = client.models.list().data[0].id
        r = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=16, temperature=0)
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=16, temperature=0, stream=True) if c.choices)
    plain = [MESSAGES[0], {"role": "user", "content": "What is the capital of France?"}]
    expected = LLM(**ENGINE_ARGS).chat(plain, SamplingParams(temperature=0, max_tokens=16))[0].outputs[0].text
    assert r.choices[0].message.content == expected == streamed
    # On topic; whether it says Paris depends on the path: the default serves the file's 4-bit blocks as stored
    # with int8 activations (as llama.cpp), which on this prompt tips a near-tie (its perplexity is close to the
    # dequantized weights': docs/benchmarks.md#quantization). tests/test_builtin_model.py checks Paris on the exact
    # path.
    assert "France" in expected
    assert r.usage.completion_tokens <= 16 and r.usage.prompt_tokens > 10


def test_builtin_model_answers_json_that_parses_and_validates():
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                               "population_millions": {"type": "integer", "minimum": 0}},
              "required": ["city", "population_millions"], "additionalProperties": False}
    ask = [{"role": "user", "content": "Name a large city and its population in millions, as JSON."}]
    # One fixed path (the file's blocks, fp32 arithmetic, an fp32 cache): whether greedy decoding closes the
    # free-form object within max_tokens depends on the numerics, and the default path is measured per machine.
    with ServerProcess(["--max-model-len", "1024", "--kv-cache-memory", "64MB", "--dtype", "float32",
                        "--kv-cache-dtype", "float32"]) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=300)
        model = client.models.list().data[0].id
        strict = {"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": True}}
        r = client.chat.completions.create(model=model, messages=ask, max_tokens=60, temperature=0,
                                           response_format=strict)
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model=model, messages=ask, max_tokens=60, temperature=0, stream=True, response_format=strict)
            if c.choices)
        any_object = client.chat.completions.create(model=model, messages=ask, max_tokens=100, temperature=0,
                                                    response_format={"type": "json_object"})
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    assert streamed == r.choices[0].message.content
    assert any_object.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(any_object.choices[0].message.content), dict)
