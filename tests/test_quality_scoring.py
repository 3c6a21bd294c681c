"""The programmatic checks behind the task suites, the agreement measure and the threshold rule."""
from __future__ import annotations

import pytest

from tally.errors import ConfigError
from tally.quality.scoring import score, token_agreement
from tally.quality.settings import Threshold, Thresholds


@pytest.mark.parametrize("text, check, expected", [
    ('```json\n{"name": "Lena Vogel", "age": "26", "city": "lyon"}\n```',
     {"type": "json_fields", "fields": {"name": "Lena Vogel", "age": 26, "city": "Lyon"}}, 1.0),
    ('{"name": "Lena", "age": 26}', {"type": "json_fields", "fields": {"name": "Lena Vogel", "age": 26}}, 0.5),
    ("name: Lena Vogel", {"type": "json_fields", "fields": {"name": "Lena Vogel"}}, 0.0),
    ("The number is 483,920,175,532.", {"type": "number", "expected": "483920175532"}, 1.0),
    ("4839201755320", {"type": "number", "expected": "483920175532"}, 0.0),
    ("Blue, wide, deep.", {"type": "word_count", "n": 3}, 1.0),
    ("Blue - wide deep", {"type": "word_count", "n": 4}, 0.0),
    ("PARIS, FRANCE!", {"type": "uppercase"}, 1.0),
    ("Paris", {"type": "uppercase"}, 0.0),
    ("- red\n- green\n- blue\n", {"type": "bullets", "n": 3}, 1.0),
    ("Here you go:\n- red\n- green\n- blue", {"type": "bullets", "n": 3}, 0.0),
    ("Yes, it is.", {"type": "starts_with", "text": "Yes"}, 1.0),
    ("Hello Tom. Done.", {"type": "ends_with", "text": "Done"}, 1.0),
])
def test_task_checks_are_strict_about_the_ask_and_lenient_about_wrapping(text, check, expected):
    assert score(text, check) == expected


def test_token_agreement_counts_positions_before_the_first_divergence():
    assert token_agreement([1, 2, 3, 4], [1, 2, 3, 4]) == (1.0, None)
    assert token_agreement([1, 2, 3, 4], [1, 2, 9, 4]) == (0.5, 2)
    assert token_agreement([1, 2], [1, 2, 3, 4]) == (0.5, 2)  # stopping early disagrees
    assert token_agreement([], []) == (1.0, None)


def test_thresholds_judge_losses_and_parse_from_the_command_line():
    t = Threshold(2.0, 5.0)
    assert [t.verdict(x) for x in (-3.0, 1.99, 2.0, 5.0, 5.01)] == ["pass", "pass", "warn", "warn", "fail"]
    parsed = Thresholds.parse(["ppl=1,3"])
    assert parsed.ppl == Threshold(1.0, 3.0) and parsed.tasks == Thresholds().tasks
    with pytest.raises(ConfigError, match="NAME=WARN,FAIL"):
        Thresholds.parse(["ppl:1,3"])
