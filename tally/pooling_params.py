"""Per-request pooling parameters (an embedding request), with vLLM's names, validated once at the edge.

Which token is pooled and whether the result is normalised by default are the model's (PoolerConfig,
tally/engine/pooling.py); a request may truncate the vector (`dimensions`) and override the normalisation."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tally.errors import InvalidRequestError


@dataclass(frozen=True)
class PoolingParams:
    dimensions: int | None = None  # Matryoshka: keep the first `dimensions` values (then normalise)
    normalize: bool | None = None  # None: the model's pooler config decides
    truncate_prompt_tokens: int | None = None  # keep the prompt's last k tokens
    # What the engine's front asks of any request's parameters: one sequence each, nothing to compile.
    n: ClassVar[int] = 1
    structured_outputs: ClassVar[None] = None

    def __post_init__(self) -> None:
        for name in ("dimensions", "truncate_prompt_tokens"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise InvalidRequestError(f"{name} must be a positive integer, got {value!r}", param=name)
