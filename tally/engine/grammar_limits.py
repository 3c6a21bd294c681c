"""What compiling one structured-output spec may cost: its size, checked before compiling (the grammar engine's
time grows faster than linearly with a schema's properties and a choice's strings), and the time compiling may
take. vLLM's `--structured-outputs-config` flag (JSON) sets them; every refusal names the limit and its key. One
bound is the grammar engine's own, not a setting: the properties of one object (MAX_OBJECT_PROPERTIES)."""
from __future__ import annotations

import json
from dataclasses import dataclass, fields

from tally.errors import ConfigError, InvalidRequestError, echo
from tally.sampling_params import StructuredOutputsParams

BACKENDS = ("auto", "guidance")  # vLLM's backend names this engine's grammar engine (llguidance) answers to
# In one object: llguidance's parser holds 2,000 items in a row (its max_items_in_row) and an object's next key takes
# four per property, so a larger object compiles (for seconds) and then fails at its first key, mid-answer.
MAX_OBJECT_PROPERTIES = 480


@dataclass(frozen=True)
class GrammarLimits:
    max_bytes: int = 1 << 20  # the spec as JSON text: a schema, regex, grammar or the choice's strings
    max_properties: int = 5000  # of a JSON schema, all objects together: OpenAI's limit for strict schemas
    max_choices: int = 10_000  # a choice's strings, or a schema's enum values together
    compile_timeout_s: float = 30.0  # from the request's arrival to a compiled grammar (server only)
    cache_size: int = 64  # compiled grammars kept for requests that repeat a spec

    @classmethod
    def parse(cls, value: str | dict | None) -> GrammarLimits:
        """From `--structured-outputs-config` (a JSON object, or None for the defaults)."""
        if value is None:
            return cls()
        try:
            value = json.loads(value) if isinstance(value, str) else value
        except ValueError as exc:
            raise ConfigError(f"structured_outputs_config is not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ConfigError("structured_outputs_config is a JSON object, e.g. '{\"max_properties\": 10000}'")
        value = dict(value)
        backend = value.pop("backend", "auto")
        if backend not in BACKENDS:
            raise ConfigError(f"structured_outputs_config backend {echo(backend)}: this engine compiles grammars "
                              f"with llguidance (vLLM's \"guidance\"); use one of {', '.join(BACKENDS)}")
        known = {f.name: f.type for f in fields(cls)}
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise ConfigError(f"structured_outputs_config: unknown keys {unknown}; it takes {sorted(known)} and "
                              "backend")
        for key, v in value.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ConfigError(f"structured_outputs_config {key} must be a positive number, got {echo(v)}")
        return cls(**{k: (float(v) if k == "compile_timeout_s" else int(v)) for k, v in value.items()})

    def check(self, spec: StructuredOutputsParams) -> None:
        """InvalidRequestError naming the limit `spec` passes, and the key that raises it."""
        size_bytes = len(_text(spec).encode("utf-8", "surrogatepass"))
        self._within(size_bytes, self.max_bytes, "max_bytes", spec, "bytes", "shorten it")
        if spec.choice is not None:
            self._within(len(spec.choice), self.max_choices, "max_choices", spec, "strings", "offer fewer")
        elif isinstance(spec.json, dict):
            properties, largest, enum_values = _schema_counts(spec.json)
            self._within(properties, self.max_properties, "max_properties", spec, "properties",
                         "split the schema into smaller ones")
            if largest > MAX_OBJECT_PROPERTIES:
                raise InvalidRequestError(
                    f"structured output json has an object of {largest:,} properties; the grammar engine generates "
                    f"at most {MAX_OBJECT_PROPERTIES:,} in one object: group them in nested objects",
                    param="structured_outputs")
            self._within(enum_values, self.max_choices, "max_choices", spec, "enum values", "offer fewer")

    def largest_schema(self, title: str = "") -> dict:
        """The largest JSON schema these limits admit (benchmarks and tests send it): objects of
        MAX_OBJECT_PROPERTIES short strings in one object, as many as max_properties allows in all."""
        count = min(self.max_properties // (MAX_OBJECT_PROPERTIES + 1), MAX_OBJECT_PROPERTIES)
        inner = {"type": "object", "additionalProperties": False,
                 "properties": {f"p{i}": {"type": "string", "maxLength": 2} for i in range(MAX_OBJECT_PROPERTIES)}}
        return {"title": title, "type": "object", "additionalProperties": False,
                "properties": {f"o{j}": inner for j in range(count)}}

    @staticmethod
    def _within(count: int, limit: int, key: str, spec: StructuredOutputsParams, unit: str, fix: str) -> None:
        if count > limit:
            raise InvalidRequestError(
                f"structured output {spec.kind} has {count:,} {unit}; at most {limit:,} are accepted ({key} of the "
                f"server's --structured-outputs-config): {fix}", param="structured_outputs")


def _text(spec: StructuredOutputsParams) -> str:
    value = getattr(spec, spec.kind)
    return value if isinstance(value, str) else json.dumps(value)


def _schema_counts(schema: dict) -> tuple[int, int, int]:
    """(properties, the most in one object, enum values) of every object in a JSON schema, walked without
    recursion."""
    properties = largest = enum_values = 0
    stack: list[object] = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("properties"), dict):
                properties += len(node["properties"])
                largest = max(largest, len(node["properties"]))
            if isinstance(node.get("enum"), list):
                enum_values += len(node["enum"])
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return properties, largest, enum_values
