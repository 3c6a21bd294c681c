"""What every scorer shares: the score it gives one answer, and the reader of its parameters from a suite line, whose
errors name the file, the line and the field."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from tally.errors import ConfigError, echo

_MISSING = object()


@dataclass(frozen=True)
class ItemScore:
    score: float  # in [0, 1]
    fields: dict[str, float] = field(default_factory=dict)  # json_fields: each expected field, 1 right or 0 wrong
    reason: str | None = None  # why the score is below 1, when the scorer can say


class Params:
    """A scorer's parameters as written on a suite line (`where`: "FILE:LINE"); each getter checks one field."""

    def __init__(self, raw: dict[str, Any], where: str, known: tuple[str, ...]) -> None:
        self.raw, self.where = raw, where
        unknown = sorted(set(raw) - {"type", *known})
        if unknown:
            self.fail(unknown[0], f"is not a parameter of scorer {raw['type']!r}; it takes "
                      f"{', '.join(known) or 'none'}")

    def fail(self, name: str, problem: str) -> None:
        raise ConfigError(f"{self.where}: field scorer.{name} {problem}")

    def _get(self, name: str, default: Any) -> Any:
        if name not in self.raw:
            if default is _MISSING:
                self.fail(name, f"is missing; scorer {self.raw['type']!r} needs it")
            return default
        return self.raw[name]

    def text(self, name: str, default: Any = _MISSING) -> str:
        value = self._get(name, default)
        if not isinstance(value, str):
            self.fail(name, f"must be a string, got {echo(value)}")
        return value

    def texts(self, name: str) -> tuple[str, ...]:
        """A string, or a non-empty list of strings (any of them is right)."""
        value = self._get(name, _MISSING)
        values = [value] if isinstance(value, str) else value
        if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
            self.fail(name, f"must be a string or a non-empty list of strings, got {echo(value)}")
        return tuple(values)

    def number(self, name: str, default: Any = _MISSING, minimum: float | None = None,
               maximum: float | None = None) -> float:
        value = self._get(name, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            self.fail(name, f"must be a number, got {echo(value)}")
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            self.fail(name, f"must be in [{minimum if minimum is not None else '-inf'}, "
                      f"{maximum if maximum is not None else 'inf'}], got {value!r}")
        return float(value)

    def boolean(self, name: str, default: bool) -> bool:
        value = self._get(name, default)
        if not isinstance(value, bool):
            self.fail(name, f"must be true or false, got {echo(value)}")
        return value

    def choice(self, name: str, options: tuple[str, ...]) -> str:
        value = self._get(name, options[0])
        if value not in options:
            self.fail(name, f"must be one of {', '.join(options)}, got {echo(value)}")
        return value

    def mapping(self, name: str) -> dict[str, Any]:
        value = self._get(name, _MISSING)
        if not isinstance(value, dict) or not value:
            self.fail(name, f"must be a non-empty JSON object, got {echo(value)}")
        return value
