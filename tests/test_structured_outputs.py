"""Structured outputs: what a request constrains decoding to (a JSON schema, any JSON object, a regex, a choice, a
Lark or GBNF grammar) is what comes back, for every schema a small generator makes, batched; bad schemas are 400s."""
from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest

from tally import LLM, SamplingParams
from tally.engine.config import EngineConfig
from tally.engine.grammar_limits import MAX_OBJECT_PROPERTIES, GrammarLimits
from tally.errors import ConfigError, InvalidRequestError
from tally.sampling_params import StructuredOutputsParams


def random_schema(rng: random.Random, depth: int = 0) -> dict:
    """A small JSON schema: an object of a few typed, bounded properties (so any output that obeys it ends)."""
    def leaf() -> dict:
        # No "number": its digits are unbounded, and a random model fills them until max_tokens.
        kind = rng.choice(["string", "integer", "boolean", "enum", "array"] + (["object"] if depth < 1 else []))
        if kind == "string":
            return {"type": "string", "maxLength": rng.randint(1, 8)}
        if kind == "integer":
            low = rng.randint(-50, 50)
            return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 100)}
        if kind == "enum":
            return {"enum": rng.sample(["red", "green", "blue", "cyan", "x y", "1"], rng.randint(1, 4))}
        if kind == "array":
            return {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                    "maxItems": rng.randint(0, 3)}
        if kind == "object":
            return random_schema(rng, depth + 1)
        return {"type": "boolean"}
    names = rng.sample(["a", "b", "name", "id", "tags", "ok", "v2", "x_y"], rng.randint(1, 4))
    return {"type": "object", "properties": {n: leaf() for n in names},
            "required": rng.sample(names, rng.randint(0, len(names))), "additionalProperties": False}


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(str(tiny_llama), dtype="float32", kv_cache_memory=8_000_000)


def _generate(llm, specs: list[StructuredOutputsParams], temperature: float = 0.0, seed: int = 0):
    params = [SamplingParams(temperature=temperature, seed=seed + i, max_tokens=200, structured_outputs=s)
              for i, s in enumerate(specs)]
    return [o.outputs[0] for o in llm.generate(["Answer in JSON:"] * len(specs), params, use_tqdm=False)]


def test_a_hundred_random_schemas_all_validate_batched(llm):
    rng = random.Random(0)
    schemas = [random_schema(rng) for _ in range(100)]
    outs = _generate(llm, [StructuredOutputsParams(json=s) for s in schemas[:50]])  # greedy
    outs += _generate(llm, [StructuredOutputsParams(json=s) for s in schemas[50:]], temperature=1.0)  # sampled
    for schema, out in zip(schemas, outs):
        assert out.finish_reason == "stop", (schema, out.text)
        jsonschema.validate(json.loads(out.text), schema)


def test_regex_choice_and_grammars(llm):
    """(Any JSON object is checked on the built-in model, tests/test_server_builtin.py: a random model never closes
    an unbounded one.)"""
    specs = [StructuredOutputsParams(regex=r"[a-z]{2,5}-\d{3}"),
             StructuredOutputsParams(choice=["yes", "no", "not sure"]),
             StructuredOutputsParams(grammar='start: "x=" NUMBER ";"\nNUMBER: /[0-9]{1,4}/'),  # Lark
             StructuredOutputsParams(grammar='root ::= "(" [ab]{1,6} ")"')]  # llama.cpp's GBNF
    outs = _generate(llm, specs, temperature=1.0)
    assert all(o.finish_reason == "stop" for o in outs), outs
    code, choice, lark, gbnf = (o.text for o in outs)
    assert re.fullmatch(r"[a-z]{2,5}-\d{3}", code)
    assert choice in ("yes", "no", "not sure")
    assert re.fullmatch(r"x=[0-9]{1,4};", lark)
    assert re.fullmatch(r"\([ab]{1,6}\)", gbnf)


@pytest.mark.parametrize("spec, message", [
    (StructuredOutputsParams(regex="[a-z"), "regex is not valid"),
    (StructuredOutputsParams(grammar="start: undefined_rule"), "grammar is not valid"),
    (StructuredOutputsParams(json={"type": "object", "properties": {"a": {"$ref": "#/nope"}}}), "json is not valid"),
])
def test_a_bad_constraint_is_refused_when_the_request_is_added(llm, spec, message):
    with pytest.raises(InvalidRequestError, match=message):
        llm.generate("x", SamplingParams(structured_outputs=spec), use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()


def test_exactly_one_constraint():
    with pytest.raises(InvalidRequestError, match="exactly one"):
        StructuredOutputsParams(regex="a", choice=["a"])
    with pytest.raises(InvalidRequestError, match="exactly one"):
        StructuredOutputsParams()


def test_a_spec_is_compiled_once_for_all_the_samples_and_prompts_that_share_it(llm):
    spec = StructuredOutputsParams(regex=r"[a-c]{3}")
    before = llm.engine.grammars.num_compiled
    params = SamplingParams(n=4, temperature=1.0, seed=0, max_tokens=8, structured_outputs=spec)
    outs = llm.generate(["a", "b"], params, use_tqdm=False)
    assert all(re.fullmatch(r"[a-c]{3}", c.text) for o in outs for c in o.outputs), outs
    assert llm.engine.grammars.num_compiled == before + 1


def test_the_largest_objects_the_limits_admit_are_generated_past_their_first_key(llm):
    """An object past what the grammar engine's parser holds compiles, then fails at its first key (the answer is
    `{`); the bound on one object's properties keeps every admitted object within it."""
    one_object = {"type": "object", "additionalProperties": False,
                  "properties": {f"p{i}": {"type": "string", "maxLength": 2} for i in range(MAX_OBJECT_PROPERTIES)}}
    nested = GrammarLimits().largest_schema()
    for schema, prefix in ((one_object, '{"p'), (nested, '{"o')):
        out = _generate(llm, [StructuredOutputsParams(json=schema)], temperature=1.0)[0]
        assert out.text.startswith(prefix) and len(out.token_ids) > 2, out
    one_object["properties"]["one_more"] = {"type": "string"}
    with pytest.raises(InvalidRequestError, match=f"at most {MAX_OBJECT_PROPERTIES} in one object"):
        llm.generate("x", SamplingParams(structured_outputs=StructuredOutputsParams(json=one_object)), use_tqdm=False)


@pytest.mark.parametrize("config, message", [
    ('{"backend": "xgrammar"}', "llguidance"),
    ('{"max_propertie": 1}', "unknown keys"),
    ('{"compile_timeout_s": -1}', "positive"),
])
def test_a_bad_structured_outputs_config_is_refused_at_start(config, message):
    with pytest.raises(ConfigError, match=message):
        EngineConfig(structured_outputs_config=config)
