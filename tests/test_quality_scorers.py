"""The user-suite scorers, the suite file's checks, the code sandbox, the bootstrap and the rules file, each on its
own (no model): what a right and a wrong answer score, and what each bad line or rule says."""
from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest

from tally.errors import ConfigError
from tally.quality.bootstrap import mean_ci, paired_diff_ci
from tally.quality.sandbox import Limits, isolation, run_python
from tally.quality.scorers import parse_scorer, safe_score
from tally.quality.scorers_text import normalize
from tally.quality.suite_compare import group_results, judge
from tally.quality.suite_file import read_suite
from tally.quality.suite_rules import BROKEN, HELD, TOO_FEW, parse_rules
from tally.quality.suite_run import ItemResult


def _score(spec: dict, answer: str, prompt: str | None = None):
    return safe_score(parse_scorer(spec, "t.jsonl:1"), answer, prompt)


@pytest.mark.parametrize("spec, right, wrong", [
    ({"type": "exact", "expected": ["Paris", "paris"]}, "  Paris\n", "Paris."),
    ({"type": "normalized", "expected": "The Eiffel-Tower"}, "the  eiffel tower!", "eiffel"),
    ({"type": "normalized", "expected": "eiffel tower", "contains": True}, "It is the Eiffel Tower.", "eiffelтower"),
    ({"type": "regex", "pattern": r"\d{3}-\d{4}"}, "call 555-1234 now", "call 5551234"),
    ({"type": "regex", "pattern": "yes|no", "mode": "full", "flags": ["IGNORECASE"]}, " YES ", "yes, sure"),
    ({"type": "numeric", "expected": 1234.5, "abs_tol": 0.01}, "first 7, then 1,234.5", "1,234.5 then 7"),
    ({"type": "numeric", "expected": 100, "rel_tol": 0.05, "pick": "any"}, "96 or 300", "94 or 300"),
    ({"type": "json_schema", "schema": {"type": "object", "required": ["a"], "properties": {"a": {"type": "integer"}}}},
     'Here: ```json\n{"a": 3}\n```', '{"a": "3"}'),
    ({"type": "json_schema", "schema": {"type": "array"}, "strict": True}, " [1, 2] ", "list: [1, 2]"),
    ({"type": "json_schema", "schema": {"type": "object", "required": ["a"]}},  # a fence closes, another opens
     '{"a": 1}\n```\n\nAlso:\n```json\n{"b"', '```\n{"b": 1}\n```'),
    ({"type": "code", "tests": "assert double(4) == 8", "timeout_s": 20},
     "```python\ndef double(x):\n    return 2 * x\n```", "def double(x):\n    return x + 2"),
])
def test_each_scorer_scores_a_right_answer_1_and_a_wrong_one_0_with_a_reason(spec, right, wrong):
    assert _score(spec, right).score == 1.0
    scored = _score(spec, wrong)
    assert scored.score == 0.0 and scored.reason


def test_json_fields_scores_each_field_and_the_share_right():
    spec = {"type": "json_fields", "fields": {"name": "Lena Vogel", "age": 26, "city": "Lyon"}}
    scored = _score(spec, 'Sure! {"name": "lena vogel ", "age": "26", "city": "Paris"} Hope that helps.')
    assert scored.fields == {"name": 1.0, "age": 1.0, "city": 0.0}
    assert scored.score == pytest.approx(2 / 3) and "city" in scored.reason
    nothing = _score(spec, "I cannot help with that.")
    assert nothing.score == 0.0 and nothing.fields == {"name": 0.0, "age": 0.0, "city": 0.0}


def test_code_with_prompt_completes_the_prompt_before_the_tests():
    spec = {"type": "code", "tests": "assert inc(1) == 2", "with_prompt": True, "timeout_s": 20}
    assert _score(spec, "    return x + 1\n", prompt="def inc(x):\n").score == 1.0


def test_normalize_folds_case_unicode_punctuation_and_spaces():
    assert normalize("  Ｈéllo,\tWORLD!! ") == "héllo world"


def test_a_scorer_that_raises_fails_that_item_with_the_reason():
    class Broken:
        def score(self, answer, prompt):
            raise KeyError("surprise")

    scored = safe_score(Broken(), "answer", None)
    assert scored.score == 0.0 and "KeyError" in scored.reason and "surprise" in scored.reason


@pytest.mark.parametrize("line, words", [
    ({"prompt": "hi"}, ["t.jsonl:2", "field scorer is missing"]),
    ({"prompt": "hi", "scorer": {"type": "bleu"}}, ["t.jsonl:2", "scorer.type 'bleu'", "exact"]),
    ({"prompt": "hi", "scorer": {"type": "regex", "pattern": "(unclosed"}}, ["t.jsonl:2", "scorer.pattern"]),
    ({"prompt": "hi", "scorer": {"type": "numeric", "expected": "four"}}, ["t.jsonl:2", "scorer.expected"]),
    ({"prompt": "hi", "scorer": {"type": "numeric", "expected": 4, "tol": 1}}, ["t.jsonl:2", "scorer.tol"]),
    ({"prompt": "hi", "scorer": {"type": "json_schema", "schema": {"type": "nope"}}}, ["scorer.schema", "valid"]),
    ({"prompt": "hi", "scorer": {"type": "code", "tests": "assert (", "timeout_s": 5}}, ["scorer.tests"]),
    ({"prompt": "hi", "scorer": {"type": "code", "tests": "pass", "memory_mb": 1}}, ["scorer.memory_mb"]),
    ({"messages": [{"role": "user", "content": "hi"}], "scorer": {"type": "code", "tests": "pass",
                                                                  "with_prompt": True}}, ["with_prompt"]),
    ({"prompt": "hi", "messages": [], "scorer": {"type": "exact", "expected": "x"}}, ["exactly one of"]),
    ({"prompt": "hi", "scorer": {"type": "exact", "expected": "x"}, "tags": "long"}, ["field tags"]),
    ({"prompt": "hi", "scorer": {"type": "exact", "expected": "x"}, "weight": 2}, ["field weight"]),
    ({"prompt": "hi", "scorer": {"type": "exact", "expected": "x"}, "id": "a"}, ["t.jsonl:2", "line 1"]),
])
def test_a_bad_suite_line_names_file_line_and_field(tmp_path, line, words):
    path = tmp_path / "t.jsonl"
    first = {"id": "a", "prompt": "ok", "scorer": {"type": "exact", "expected": "x"}}
    path.write_text(json.dumps(first) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(ConfigError) as err:
        read_suite(path, max_tokens=16)
    for word in words:
        assert word in err.value.message


def test_a_suite_decoding_line_sets_its_items_decoding(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text('{"decoding": {"temperature": 0.7, "seed": 5}}\n\n'
                    '{"prompt": "x", "scorer": {"type": "exact", "expected": "y"}, "tags": ["long"]}\n')
    suite = read_suite(path, max_tokens=16)
    item = suite.items[0]
    assert item.decoding.temperature == 0.7 and item.decoding.seed == 5 and item.decoding.max_tokens == 16
    assert item.id == "3" and item.key == "s/3" and item.tags == ("long",)
    assert suite.describe()["sha256"] and suite.describe()["decoding"]["temperature"] == 0.7


LIMITS = Limits(timeout_s=3, memory_mb=256)


@pytest.mark.parametrize("program, words", [
    ("while True:\n    pass\n", ["time limit"]),
    ("import time\ntime.sleep(60)\n", ["time limit"]),
    ("blocks = []\nwhile True:\n    blocks.append(bytearray(1 << 24))\n", ["memory"]),
    ("import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)\n", ["exit code 1"]),
])
def test_sandbox_kills_or_fails_code_at_its_limits(program, words):
    result = run_python(program, LIMITS)
    assert not result.passed
    for word in words:
        assert word in result.reason


def test_sandbox_code_writes_its_temp_dir_and_not_outside(tmp_path):
    outside = tmp_path / "escaped.txt"
    inside = run_python("open('here.txt', 'w').write('ok')\nimport os\nassert os.listdir('.')\n", LIMITS)
    assert inside.passed
    result = run_python(f"open({str(outside)!r}, 'w').write('x')\n", LIMITS)
    if isolation() == "namespace":
        assert not result.passed and "Read-only file system" in result.reason and not outside.exists()
    else:  # without namespaces the sandbox does not confine writes (docs/quality.md says so)
        assert result.passed


def test_sandbox_leaves_no_process_behind():
    mark = f"time.sleep(60.{os.getpid()})"  # this test's own child, not another's
    # In a PID namespace even a child that leaves the session dies with the program; otherwise the session is killed.
    escape = "os.setsid(); " if isolation() == "namespace" else ""
    result = run_python("import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', "
                        f"'import os, time; {escape}{mark}'])\n", LIMITS)
    assert result.passed  # exits at once
    for _ in range(100):  # SIGKILL is delivered asynchronously
        if not any(mark in _cmdline(pid) for pid in os.listdir("/proc") if pid.isdigit()):
            break
        time.sleep(0.05)
    else:
        pytest.fail("the program's background child outlived it")


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def test_bootstrap_of_identical_scores_is_exactly_zero_and_reproducible():
    scores = np.array([1, 0, 1, 1, 0, 0.5])
    assert paired_diff_ci(scores, scores) == paired_diff_ci(scores, scores)
    same = paired_diff_ci(scores, scores)
    assert same.estimate == same.low == same.high == 0.0


def test_bootstrap_interval_covers_the_mean_and_narrows_with_more_items():
    rng = np.random.default_rng(1)
    small, large = rng.random(20) < 0.7, rng.random(2000) < 0.7
    ci_small, ci_large = mean_ci(small), mean_ci(large)
    assert ci_small.low <= ci_small.estimate <= ci_small.high
    assert ci_large.high - ci_large.low < (ci_small.high - ci_small.low) / 5
    assert ci_large.low < 0.7 < ci_large.high
    worse = paired_diff_ci(np.ones(50), np.r_[np.ones(40), np.zeros(10)])
    assert worse.estimate == pytest.approx(-0.2) and worse.high < 0


def _results(scores: list[float], tags: list[tuple[str, ...]]) -> list[ItemResult]:
    return [ItemResult(f"s/{i}", "s", str(i), i + 1, t, "exact", s, {"all": s, "exact": s}, None, "", None)
            for i, (s, t) in enumerate(zip(scores, tags))]


def test_rules_judge_the_interval_or_the_estimate_and_refuse_too_few_items():
    tags = [("long",)] * 4 + [()] * 16
    base = _results([1.0] * 20, tags)
    cand = _results([1.0] * 19 + [0.0], tags)  # one item of 20 lost: 5 points
    groups = group_results(base, cand, 0.95)
    rules = {"rules": [{"metric": "all", "max_drop": "20%"}, {"metric": "all", "max_drop": "10%"},
                       {"metric": "exact", "tag": "long", "max_drop": 0.5}]}
    by_ci = judge(parse_rules({**rules, "min_items": 5}, "r.yaml"), groups)
    # The bootstrap draws that item 3 times in more than 2.5% of resamples: the interval's worse end is 15 points.
    assert [v.verdict for v in by_ci] == [HELD, BROKEN, TOO_FEW]
    assert by_ci[0].judged == pytest.approx(0.15)
    by_estimate = judge(parse_rules({**rules, "min_items": 1, "decide": "estimate",
                                     "rules": [{"metric": "all", "max_drop": "4%"}]}, "r.yaml"), groups)
    assert by_estimate[0].verdict == BROKEN and by_estimate[0].judged == pytest.approx(0.05)
    same = judge(parse_rules({"min_items": 1, "rules": [{"metric": "all", "max_drop": 0}]}, "r.yaml"),
                 group_results(base, base, 0.95))
    assert same[0].verdict == HELD


@pytest.mark.parametrize("data, words", [
    ({"rules": []}, ["at least one rule"]),
    ({"rules": [{"metric": "all"}]}, ["exactly one threshold"]),
    ({"rules": [{"metric": "all", "max_drop": "2%", "min_score": 0.5}]}, ["exactly one threshold"]),
    ({"rules": [{"metric": "all", "max_drop": "200%"}]}, ["out of range"]),
    ({"rules": [{"metric": "all", "max_drop": "2%"}], "decide": "vibes"}, ["decide"]),
    ({"rules": [{"metric": "all", "max_drop": "2%"}], "window": "5m"}, ["unknown key"]),
])
def test_a_bad_rules_file_says_what_to_write(data, words):
    with pytest.raises(ConfigError) as err:
        parse_rules(data, "r.yaml")
    for word in words:
        assert word in err.value.message
