"""The scorers a user suite's line may name, built from its `scorer` object before any model runs; and scoring one
answer so that a scorer that raises fails that item, with the reason, and never the eval."""
from __future__ import annotations

from typing import Any, Protocol

from tally.errors import ConfigError, echo
from tally.quality.scorer_params import ItemScore, Params
from tally.quality.scorers_code import Code
from tally.quality.scorers_json import JsonFields, JsonSchema
from tally.quality.scorers_text import Exact, Normalized, Numeric, Regex


class Scorer(Protocol):
    def score(self, answer: str, prompt: str | None) -> ItemScore: ...


# name -> (class, its parameters besides `type`)
SCORERS: dict[str, tuple[Any, tuple[str, ...]]] = {
    "exact": (Exact, ("expected",)),
    "normalized": (Normalized, ("expected", "contains")),
    "regex": (Regex, ("pattern", "mode", "flags")),
    "json_schema": (JsonSchema, ("schema", "strict")),
    "json_fields": (JsonFields, ("fields", "strict")),
    "numeric": (Numeric, ("expected", "abs_tol", "rel_tol", "pick")),
    "code": (Code, ("tests", "with_prompt", "timeout_s", "memory_mb")),
}


def parse_scorer(raw: object, where: str) -> Scorer:
    """A suite line's `scorer` → its scorer; `where` ("FILE:LINE") opens every error."""
    if raw is None:
        raise ConfigError(f"{where}: field scorer is missing; write e.g. \"scorer\": {{\"type\": \"exact\", "
                          f"\"expected\": \"Paris\"}} (types: {', '.join(SCORERS)})")
    if not isinstance(raw, dict) or "type" not in raw:
        raise ConfigError(f"{where}: field scorer must be an object with a type ({', '.join(SCORERS)}), "
                          f"got {echo(raw)}")
    if raw["type"] not in SCORERS:
        raise ConfigError(f"{where}: field scorer.type {echo(raw['type'])} is not a scorer; use one of "
                          f"{', '.join(SCORERS)}")
    cls, known = SCORERS[raw["type"]]
    return cls.parse(Params(raw, where, known))


def safe_score(scorer: Scorer, answer: str, prompt: str | None) -> ItemScore:
    try:
        return scorer.score(answer, prompt)
    except Exception as e:  # a scorer's bug or an answer it did not expect: this item fails, the eval goes on
        return ItemScore(0.0, reason=f"the scorer raised {type(e).__name__}: {e}")
