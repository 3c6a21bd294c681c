"""Scorers that read an answer as JSON: compliance with a JSON schema, and the fields of an extracted object (each
field scored on its own, so the report can say which field a model gets wrong)."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from tally.quality.scorer_params import ItemScore, Params
from tally.quality.scoring import same_value

_FENCE = re.compile(r"```[A-Za-z]*\s*\n(.*?)```", re.DOTALL)


def _first_value(text: str) -> Any:
    """The JSON object or array that starts at the first { or [ of the text (text after it is ignored)."""
    starts = [i for i in (text.find("{"), text.find("[")) if i >= 0]
    if not starts:
        raise ValueError("no { or [")
    return json.JSONDecoder().raw_decode(text, min(starts))[0]


def extract_json(answer: str, strict: bool) -> tuple[Any, str | None]:
    """(the value, None) or (None, why not). Strict: the stripped answer is JSON and nothing else. Lenient (the
    default): else the inside of the first ``` fence, else the first JSON object or array in the text."""
    text = answer.strip()
    try:
        return json.loads(text), None
    except json.JSONDecodeError as e:
        if strict:
            return None, f"the answer is not JSON ({e.msg} at character {e.pos})"
    fence = _FENCE.search(text)
    for candidate in ([fence.group(1)] if fence else []) + [text]:
        try:
            return _first_value(candidate), None
        except ValueError:  # json.JSONDecodeError is one
            pass
    return None, "the answer holds no JSON object or array that parses"


@dataclass(frozen=True)
class JsonSchema:
    """The answer's JSON validates against `schema` (any draft jsonschema knows; `$schema` picks it, else 2020-12)."""

    validator: Any  # a jsonschema validator instance
    strict: bool

    @classmethod
    def parse(cls, p: Params) -> JsonSchema:
        try:
            import jsonschema
        except ImportError:
            p.fail("type", "json_schema needs the jsonschema package: pip install 'tally[eval]'")
        schema = p.mapping("schema")
        validator_class = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        try:
            validator_class.check_schema(schema)
        except jsonschema.SchemaError as e:
            p.fail("schema", f"is not a valid JSON schema: {e.message}")
        return cls(validator_class(schema), p.boolean("strict", False))

    def score(self, answer: str, prompt: str | None) -> ItemScore:
        value, why = extract_json(answer, self.strict)
        if why:
            return ItemScore(0.0, reason=why)
        errors = sorted(self.validator.iter_errors(value), key=lambda e: list(e.absolute_path))
        if not errors:
            return ItemScore(1.0)
        where = "/".join(map(str, errors[0].absolute_path)) or "(top level)"
        return ItemScore(0.0, reason=f"{where}: {errors[0].message}")


@dataclass(frozen=True)
class JsonFields:
    """The answer's JSON object has each of `fields` with the expected value (numbers compared as numbers, text
    ignoring case and surrounding spaces, lists and objects exactly); the score is the share of fields right."""

    fields: tuple[tuple[str, Any], ...]
    strict: bool

    @classmethod
    def parse(cls, p: Params) -> JsonFields:
        return cls(tuple(p.mapping("fields").items()), p.boolean("strict", False))

    def score(self, answer: str, prompt: str | None) -> ItemScore:
        value, why = extract_json(answer, self.strict)
        if why is None and not isinstance(value, dict):
            why = f"the answer's JSON is a {type(value).__name__}, not an object"
        obj = value if why is None else {}
        right = {name: float(name in obj and same_value(obj[name], want)) for name, want in self.fields}
        wrong = [name for name, ok in right.items() if not ok]
        reason = why or (f"wrong or missing: {', '.join(wrong)}" if wrong else None)
        return ItemScore(sum(right.values()) / len(right), right, reason)
