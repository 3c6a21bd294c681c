"""`--reasoning-parser`: a reasoning model's thinking, written between tags, split from its answer, as vLLM's
parsers do. One state machine serves both a whole text (`split`) and a stream (`streamer`), which holds back a tail
that may be a tag's beginning, so a stream's pieces add up to the whole text's split at any cut."""
from __future__ import annotations

from dataclasses import dataclass

from tally.errors import ConfigError

THINK, END_THINK = "<think>", "</think>"
GENERIC = "tags"  # "tags:START,END": any other pair of tags


@dataclass(frozen=True)
class ReasoningParser:
    """Thinking runs from `start` to `end`. `implicit_start`: the chat template already opened it (DeepSeek-R1), so
    text before `end` is thinking even without `start`; otherwise only a `start` begins it (Qwen3)."""

    name: str
    start: str
    end: str
    implicit_start: bool

    def split(self, text: str) -> tuple[str | None, str]:
        """The whole text → (thinking, or None when there was none, answer)."""
        stream = self.streamer()
        reasoning, answer = stream.feed(text)
        more_reasoning, more_answer = stream.finish()
        return (reasoning + more_reasoning if stream.thought else None), answer + more_answer

    def streamer(self) -> ReasoningStream:
        return ReasoningStream(self)


class ReasoningStream:
    """A text's pieces in order → each piece's (thinking, answer) parts; `finish` flushes what was held back."""

    def __init__(self, parser: ReasoningParser) -> None:
        self.parser = parser
        self.state = "reasoning" if parser.implicit_start else "before"  # → "reasoning" → "answer"
        self.thought = parser.implicit_start  # a thinking section began
        self.at_start = parser.implicit_start  # nothing read yet: a leading start tag is dropped
        self._held = ""

    def feed(self, delta: str) -> tuple[str, str]:
        text, self._held = self._held + delta, ""
        reasoning, answer = [], []
        while text:
            if self.state == "answer":
                answer.append(text)
                break
            if self.at_start:  # implicit start: the model may still write the tag the template already wrote
                if len(text) < len(self.parser.start) and self.parser.start.startswith(text):
                    self._held = text
                    break
                text = text.removeprefix(self.parser.start)
                self.at_start = False
                continue
            tag = self.parser.start if self.state == "before" else self.parser.end
            out = answer if self.state == "before" else reasoning
            found = text.find(tag)
            if found < 0:
                keep = _partial_tag(text, tag)
                out.append(text[:len(text) - keep])
                self._held = text[len(text) - keep:]
                break
            out.append(text[:found])
            text = text[found + len(tag):]
            self.state = "reasoning" if self.state == "before" else "answer"
            self.thought = True
        return "".join(reasoning), "".join(answer)

    def finish(self) -> tuple[str, str]:
        """What was held back, as the text it turned out to be (a tag's beginning that never completed)."""
        held, self._held = self._held, ""
        return (held, "") if self.state == "reasoning" else ("", held)


def _partial_tag(text: str, tag: str) -> int:
    """Length of the longest tail of `text` that is a proper beginning of `tag`."""
    return next((k for k in range(min(len(tag) - 1, len(text)), 0, -1) if tag.startswith(text[-k:])), 0)


_NAMED = {
    # R1's template opens the thinking itself; R1-0528 and the distills may write <think> again.
    "deepseek_r1": ReasoningParser("deepseek_r1", THINK, END_THINK, implicit_start=True),
    # Qwen3 writes both tags; with enable_thinking false its template closes an empty section in the prompt.
    "qwen3": ReasoningParser("qwen3", THINK, END_THINK, implicit_start=False),
    "mistral": ReasoningParser("mistral", "[THINK]", "[/THINK]", implicit_start=False),
}
REASONING_PARSERS: tuple[str, ...] = (*_NAMED, f"{GENERIC}:START,END")


def reasoning_parser(name: str) -> ReasoningParser:
    """A parser by its --reasoning-parser name: one of REASONING_PARSERS, `tags:START,END` with both tags given."""
    if name in _NAMED:
        return _NAMED[name]
    kind, _, tags = name.partition(":")
    start, comma, end = tags.partition(",")
    if kind == GENERIC and comma and start.strip() and end.strip():
        return ReasoningParser(name, start.strip(), end.strip(), implicit_start=False)
    raise ConfigError(f"unknown reasoning parser {name!r}; known: {', '.join(REASONING_PARSERS)} (e.g. "
                      f"'{GENERIC}:<reasoning>,</reasoning>')")
