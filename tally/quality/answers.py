"""Where a user suite's answers come from: a model loaded here (answers_local.py) or any OpenAI-compatible server
(answers_url.py). Both take the same items and decode them as their suite says."""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Protocol

from tally.quality.suite_file import SuiteItem


@dataclass(frozen=True)
class Answer:
    text: str
    output_tokens: int | None = None
    error: str | None = None  # the model gave no answer (a refused request, a prompt over max_model_len, ...)


class AnswerSource(Protocol):
    def describe(self) -> dict[str, Any]:
        """The model, as the results file records it (and compares it on --resume)."""

    def answer(self, items: list[SuiteItem]) -> list[Answer]:
        """One answer per item, in order; an item the model could not answer gets an Answer with its error."""


def item_seed(item: SuiteItem) -> int | None:
    """Sampled decoding: a seed per item from the suite's seed and the item's key, so a resumed run or another
    batch size draws the same; None when greedy."""
    return None if item.decoding.greedy else item.decoding.seed + zlib.crc32(item.key.encode())
