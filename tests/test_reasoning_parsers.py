"""The --reasoning-parser parsers (tally/server/reasoning.py): vLLM's splits of thinking from answer, and a stream
cut anywhere adds up to the whole text's split."""
from __future__ import annotations

import pytest

from tally.errors import ConfigError
from tally.server.reasoning import REASONING_PARSERS, reasoning_parser

CASES = [
    # (parser, text, reasoning, answer)
    ("deepseek_r1", "I think so.</think>\n\nYes.", "I think so.", "\n\nYes."),
    ("deepseek_r1", "<think>Hmm.</think>42", "Hmm.", "42"),
    ("deepseek_r1", "still thinking, cut by max_tokens", "still thinking, cut by max_tokens", ""),
    ("deepseek_r1", "<thin", "<thin", ""),
    ("deepseek_r1", "a < b </thin and </think>x</think>", "a < b </thin and ", "x</think>"),
    ("deepseek_r1", "", "", ""),
    ("qwen3", "<think>\nplan\n</think>\n\n{\"a\": 1}", "\nplan\n", "\n\n{\"a\": 1}"),
    ("qwen3", "no tags at all", None, "no tags at all"),
    ("qwen3", "answer only</think>", None, "answer only</think>"),
    ("qwen3", "<think></think>empty thought", "", "empty thought"),
    ("qwen3", "x <thi", None, "x <thi"),
    ("qwen3", "<think>cut short", "cut short", ""),
    ("mistral", "[THINK]a[/THINK]b", "a", "b"),
    ("tags:<r>,</r>", "<r>why</r>what", "why", "what"),
]


@pytest.mark.parametrize("name,text,reasoning,answer", CASES)
def test_split_separates_thinking_from_answer(name: str, text: str, reasoning: str | None, answer: str) -> None:
    assert reasoning_parser(name).split(text) == (reasoning, answer)


@pytest.mark.parametrize("name,text", [(c[0], c[1]) for c in CASES])
def test_stream_cut_anywhere_adds_up_to_split(name: str, text: str) -> None:
    parser = reasoning_parser(name)
    want_reasoning, want_answer = parser.split(text)
    cuts = [(i, j) for i in range(len(text) + 1) for j in range(i, len(text) + 1)]
    for i, j in cuts:
        stream = parser.streamer()
        parts = [stream.feed(p) for p in (text[:i], text[i:j], text[j:])] + [stream.finish()]
        assert "".join(r for r, _ in parts) == (want_reasoning or ""), (i, j)
        assert "".join(a for _, a in parts) == want_answer, (i, j)


def test_stream_holds_back_only_a_possible_tag() -> None:
    stream = reasoning_parser("qwen3").streamer()
    assert stream.feed("<think>abc</") == ("abc", "")
    assert stream.feed("th") == ("", "")
    assert stream.feed("ink>ok") == ("", "ok")
    stream = reasoning_parser("deepseek_r1").streamer()
    assert stream.feed("x </th") == ("x ", "")
    assert stream.feed("e> y") == ("</the> y", "")


def test_unknown_parser_names_the_known_ones() -> None:
    for bad in ("deepseek", "tags:<r>", "tags:,</r>"):
        with pytest.raises(ConfigError, match="known: deepseek_r1, qwen3"):
            reasoning_parser(bad)
    assert REASONING_PARSERS[:2] == ("deepseek_r1", "qwen3")
