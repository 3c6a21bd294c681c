"""Prompts made of real text (three public-domain plays, data/shakespeare.txt) cut to an exact
token count with the server's tokenizer: a slice of the tokenized corpus is decoded, re-encoded
and its length corrected until the count is exact (usually the first try)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tally.bench.tokenizer import Tokenizer

CORPUS_PATH = Path(__file__).parents[1] / "data" / "shakespeare.txt"
_PIECE_CHARS = 8_000  # the corpus is tokenized in pieces a server's /tokenize will accept
_MAX_TRIES = 4  # length corrections per start offset
_MAX_SHIFTS = 4  # start offsets tried before settling for the closest count
SYSTEM_SEPARATOR = "\n\n"


@dataclass(frozen=True)
class Prompt:
    text: str  # what a completions request sends (system prompt, separator, user part)
    system_text: str | None  # the shared prefix, when this request has one
    user_text: str
    tokens: int  # token count of `text` by the tokenizer, including special tokens it adds


def _pieces(text: str) -> list[str]:
    """Splits at blank lines into pieces of about _PIECE_CHARS characters."""
    pieces, current = [], ""
    for paragraph in text.split("\n\n"):
        current += paragraph + "\n\n"
        if len(current) >= _PIECE_CHARS:
            pieces.append(current)
            current = ""
    return pieces + ([current] if current else [])


class PromptBuilder:
    def __init__(self, tokenizer: Tokenizer, corpus_ids: list[int], overhead_ids: list[int]):
        self.tokenizer = tokenizer
        self.corpus_ids = corpus_ids
        self.overhead_tokens = len(overhead_ids)  # special tokens added to every text (BOS)
        self.system_text: str | None = None
        self.system_tokens = 0
        self._system_prefix_tokens = 0  # system prompt + separator, as a prefix
        self.inexact_prompts = 0  # prompts whose exact count could not be reached

    @classmethod
    async def create(cls, tokenizer: Tokenizer, corpus_path: Path = CORPUS_PATH) -> PromptBuilder:
        overhead = await tokenizer.encode("")
        ids: list[int] = []
        for piece in _pieces(corpus_path.read_text(encoding="utf-8")):
            piece_ids = await tokenizer.encode(piece)
            ids += piece_ids[len(overhead):] if piece_ids[:len(overhead)] == overhead else piece_ids
        return cls(tokenizer, ids, overhead)

    def _slice(self, start: int, count: int) -> list[int]:
        """`count` corpus tokens from `start`, wrapping around (prompts may exceed the corpus)."""
        n = len(self.corpus_ids)
        start %= n
        out = self.corpus_ids[start:start + count]
        while len(out) < count:
            out += self.corpus_ids[: count - len(out)]
        return out

    async def _cut(self, start: int, target_tokens: int, prefix: str = "",
                   prefix_tokens: int | None = None) -> tuple[str, int]:
        """Text `prefix + slice` whose encoding has exactly `target_tokens` tokens, or the
        closest one found. `prefix_tokens` is the prefix's own count (with special tokens)."""
        prefix_tokens = self.overhead_tokens if prefix_tokens is None else prefix_tokens
        best: tuple[int, str, int] | None = None
        # A merge at the cut can make one more corpus token add two to the count; then a
        # neighbouring start offset usually lands exactly.
        for shift in range(_MAX_SHIFTS):
            count, tried = max(target_tokens - prefix_tokens, 0), set()
            while count not in tried and len(tried) < _MAX_TRIES:
                tried.add(count)
                text = prefix + await self.tokenizer.decode(self._slice(start + shift, count))
                got = len(await self.tokenizer.encode(text))
                if best is None or abs(got - target_tokens) < best[0]:
                    best = (abs(got - target_tokens), text, got)
                if got == target_tokens:
                    return text, got
                count = max(count + target_tokens - got, 0)
        assert best is not None
        self.inexact_prompts += 1
        return best[1], best[2]

    async def set_system_prompt(self, system_tokens: int) -> None:
        """The shared prefix: the corpus opening, cut to `system_tokens` tokens."""
        if system_tokens > 0:
            self.system_text, self.system_tokens = await self._cut(0, system_tokens)
            prefix = self.system_text + SYSTEM_SEPARATOR
            self._system_prefix_tokens = len(await self.tokenizer.encode(prefix))

    async def build(self, user_tokens: int, start: int, shared_prefix: bool) -> Prompt:
        """A prompt of `user_tokens` tokens, or `system_tokens + user_tokens` when it carries the
        shared system prompt; `start` picks where in the corpus its own text begins."""
        if shared_prefix and self.system_text is not None:
            prefix = self.system_text + SYSTEM_SEPARATOR
            text, tokens = await self._cut(start, self.system_tokens + user_tokens, prefix,
                                           self._system_prefix_tokens)
            return Prompt(text, self.system_text, text[len(prefix):], tokens)
        text, tokens = await self._cut(start, user_tokens)
        return Prompt(text, None, text, tokens)
