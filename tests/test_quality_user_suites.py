"""`tally eval --suite` end to end: a tiny checkpoint loaded here and the same checkpoint behind a real `tally serve`
on loopback (one server for the module), with small suites written here. The same model through both paths is a GO
with zero change; a damaged one is a NO-GO that names what it lost; bad suites, rules and URLs are refused before
any model runs; an interrupted eval keeps its results and resumes."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch

import tally
from tally.ports import free_port
from tally.quality.cli import EXIT_NO_GO, EXIT_USAGE, main
from tally.quality.suite_cli import EXIT_INTERRUPTED
from tally.server.process import ServerProcess

PROMPTS = ["The capital of France is", "Once upon a time", "1, 2, 3,", "def add(a, b):"]
CHATS = ["Name a colour.", "Say hello in French."]
LOCAL = ["--dtype", "float32", "--max-model-len", "256", "--threads", "1", "--max-tokens", "6", "--quiet"]
RULES = "min_items: 1\nrules:\n  - {metric: all, max_drop: 0%}\n  - {metric: exact, tag: chat, max_drop: 0%}\n"


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()  # --threads sets a process-wide torch setting
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def server(tiny_llama):
    with ServerProcess([str(tiny_llama), "--served-model-name", "tiny", "--dtype", "float32", "--max-model-len", "256",
                        "--kv-cache-memory", "8MB", "--log-level", "warning"]) as s:
        yield s


def _served_answer(server: ServerProcess, prompt: str | None = None, chat: str | None = None) -> str:
    body = {"model": "tiny", "max_tokens": 6, "temperature": 0}
    if prompt is not None:
        r = httpx.post(server.base_url + "/completions", json={**body, "prompt": prompt}, timeout=60)
        return r.json()["choices"][0]["text"]
    r = httpx.post(server.base_url + "/chat/completions", json={**body, "messages": [{"role": "user",
                                                                                         "content": chat}]}, timeout=60)
    return r.json()["choices"][0]["message"]["content"]


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def suite(server, tmp_path_factory) -> Path:
    """Exact-match items whose expected answers are the served model's own greedy answers (so a sound model scores
    100%), a chat item per tag, a code item and a json_fields item the tiny model fails either way."""
    rows = [{"id": f"p{i}", "prompt": p, "tags": ["text"],
             "scorer": {"type": "exact", "expected": _served_answer(server, prompt=p).strip()}}
            for i, p in enumerate(PROMPTS)]
    rows += [{"id": f"c{i}", "messages": [{"role": "user", "content": c}], "tags": ["chat"],
              "scorer": {"type": "exact", "expected": _served_answer(server, chat=c).strip()}}
             for i, c in enumerate(CHATS)]
    rows += [{"id": "code", "prompt": "def double(x):", "scorer": {"type": "code", "tests": "assert double(2) == 4",
                                                                   "with_prompt": True, "timeout_s": 20}},
             {"id": "json", "prompt": "Lena is 26. JSON:", "tags": ["text"],
              "scorer": {"type": "json_fields", "fields": {"name": "Lena", "age": 26}}}]
    return _write(tmp_path_factory.mktemp("suite") / "mine.jsonl", rows)


def _rules(tmp_path: Path, text: str = RULES) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    return path


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_local_and_served_model_answer_alike_and_the_gate_says_go(tiny_llama, server, suite, tmp_path):
    out = tmp_path / "report.json"
    rc = main(["--suite", str(suite), "--baseline", str(tiny_llama), "--candidate", server.url, *LOCAL,
               "--rules", str(_rules(tmp_path)), "--results", str(tmp_path / "runs"), "--out", str(out)])
    report = json.loads(out.read_text())
    assert rc == 0 and report["go"] is True
    groups = {(g["metric"], g["tag"]): g for g in report["groups"]}
    assert groups[("exact", "all")]["baseline"]["estimate"] == 1.0 == groups[("exact", "all")]["candidate"]["estimate"]
    for g in report["groups"]:
        assert g["change"]["low"] <= 0.0 <= g["change"]["high"]
        assert g["change"]["estimate"] == 0.0
    assert groups[("all", "chat")]["n"] == 2 and groups[("json_fields.age", "text")]["n"] == 1
    assert groups[("code", "all")]["baseline"]["estimate"] == 0.0  # a random model's code does not run
    base, cand = _lines(tmp_path / "runs" / "baseline.jsonl"), _lines(tmp_path / "runs" / "candidate.jsonl")
    assert [r["answer"] for r in base[1:]] == [r["answer"] for r in cand[1:]]
    assert base[0]["header"]["model"]["kind"] == "local" and cand[0]["header"]["model"]["model"] == "tiny"
    recorded = cand[0]["header"]["suites"][0]
    assert recorded["decoding"] == {"temperature": 0.0, "top_p": 1.0, "max_tokens": 6, "seed": 0}
    assert len(recorded["sha256"]) == 64 and recorded["items"] == 8
    code = next(r for r in base[1:] if r["id"] == "code")
    assert code["score"] == 0.0 and code["reason"]
    assert [v["verdict"] for v in report["rules"]["verdicts"]] == ["held", "held"]


def test_a_damaged_candidate_is_no_go_and_the_report_names_what_it_lost(tiny_llama, server, suite, tmp_path,
                                                                         capsys):
    out = tmp_path / "report.json"
    rc = main(["--suite", str(suite), "--baseline", server.url, "--candidate", str(tiny_llama),
               "--candidate-corrupt", "zero-layer:0", *LOCAL, "--rules", str(_rules(tmp_path)),
               "--results", str(tmp_path / "runs"), "--out", str(out)])
    report = json.loads(out.read_text())
    assert rc == EXIT_NO_GO and report["go"] is False
    exact = next(g for g in report["groups"] if (g["metric"], g["tag"]) == ("exact", "all"))
    assert exact["change"]["estimate"] < 0 and exact["change"]["low"] < 0
    assert "broken" in [v["verdict"] for v in report["rules"]["verdicts"]]
    assert report["worst_items"] and report["worst_items"][0]["candidate"]["reason"]
    assert "NO-GO" in capsys.readouterr().out


def test_one_model_gets_scores_per_tag_and_min_score_rules(server, suite, tmp_path):
    out = tmp_path / "report.json"
    rules = _rules(tmp_path, "min_items: 1\nrules:\n  - {metric: exact, min_score: 90%}\n"
                             "  - {metric: json_fields, tag: text, min_score: 50%}\n")
    rc = main(["--suite", str(suite), "--baseline", server.url + "/v1", "--rules", str(rules), "--quiet",
               "--max-tokens", "6", "--results", str(tmp_path / "runs"), "--out", str(out)])
    report = json.loads(out.read_text())
    assert rc == EXIT_NO_GO and list(report["models"]) == ["baseline"]
    assert [v["verdict"] for v in report["rules"]["verdicts"]] == ["held", "broken"]


@pytest.mark.parametrize("line, rules, words", [
    ({"prompt": "x"}, None, ["bad.jsonl:2", "field scorer is missing"]),
    ({"prompt": "x", "scorer": {"type": "rouge"}}, None, ["bad.jsonl:2", "scorer.type"]),
    ({"prompt": "x", "scorer": {"type": "numeric", "expected": 1, "abs_tol": -1}}, None, ["scorer.abs_tol"]),
    ({"prompt": "x", "scorer": {"type": "exact", "expected": "y"}}, "rules:\n  - {metric: all, tag: long, "
                                                                    "max_drop: 1%}\n", ["tag 'long'"]),
    ({"prompt": "x", "scorer": {"type": "exact", "expected": "y"}}, "rules:\n  - {metric: code, max_drop: 1%}\n",
     ["metric 'code'"]),
    ({"prompt": "x", "scorer": {"type": "exact", "expected": "y"}}, "", ["--rules", "expected a mapping"]),
])
def test_bad_suites_and_rules_are_refused_before_any_model_loads(tmp_path, capsys, line, rules, words):
    suite = _write(tmp_path / "bad.jsonl", [{"prompt": "ok", "scorer": {"type": "exact", "expected": "y"}}, line])
    argv = ["--suite", str(suite), "--baseline", "/nonexistent/model", "--candidate", "/nonexistent/other",
            "--rules", str(_rules(tmp_path, RULES if rules is None else rules))]
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    for word in words:
        assert word in err


@pytest.mark.parametrize("argv, words", [
    (["--suite", "{suite}", "--thresholds", "ppl=1,2"], ["--thresholds", "go in --rules"]),
    (["--suite", "{suite}", "--limit", "3"], ["--limit"]),
    (["--rules", "rules.yaml", "--resume"], ["--rules, --resume", "add --suite"]),
])
def test_an_option_of_the_other_mode_is_refused_by_name(suite, capsys, argv, words):
    assert main([a.format(suite=suite) for a in argv]) == EXIT_USAGE
    err = capsys.readouterr().err
    for word in words:
        assert word in err


def test_comparing_without_rules_and_a_down_url_are_clear_errors(suite, tmp_path, capsys):
    assert main(["--suite", str(suite), "--baseline", "/nonexistent", "--candidate", "/other"]) == EXIT_USAGE
    assert "needs --rules" in capsys.readouterr().err
    down = f"http://127.0.0.1:{free_port()}"
    assert main(["--suite", str(suite), "--baseline", down, "--results", str(tmp_path / "r")]) == EXIT_USAGE
    assert f"{down}: cannot reach" in capsys.readouterr().err


def test_an_interrupted_eval_keeps_its_results_and_resume_runs_only_the_rest(server, tmp_path, capsys):
    marker = tmp_path / "hang"
    marker.touch()
    # The program is the prompt, then the answer, then the tests: the random model's one-token answer lands in a
    # comment, so the program's fate is the marker's (the sandbox may read files, not write them).
    hang = f"import os, time\nif os.path.exists({str(marker)!r}):\n    time.sleep(120)\n# "
    suite = _write(tmp_path / "slow.jsonl", [
        {"decoding": {"max_tokens": 1}},
        {"id": "first", "prompt": "Hello", "scorer": {"type": "regex", "pattern": ".*"}},
        {"id": "stuck", "prompt": hang, "scorer": {"type": "code", "tests": "pass", "with_prompt": True,
                                                   "timeout_s": 150}},
        {"id": "last", "prompt": "Hey", "scorer": {"type": "regex", "pattern": ".*"}}])
    results = tmp_path / "runs" / "baseline.jsonl"
    env = {**os.environ, "PYTHONPATH": str(Path(tally.__file__).parents[1])}
    argv = ["--suite", str(suite), "--baseline", server.url, "--results", str(results.parent), "--batch-size", "1"]
    proc = subprocess.Popen([sys.executable, "-m", "tally.cli", "eval", *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as at a terminal
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (results.exists() and results.read_text().count("\n") >= 2):
        time.sleep(0.2)
    time.sleep(1.0)  # now in the "stuck" item's sandbox
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_INTERRUPTED, err
    assert "(items scored: 1)" in err and "--resume" in err
    kept = results.read_text()
    assert [r.get("id") for r in _lines(results)] == [None, "first"]
    marker.unlink()
    assert main([*argv, "--resume", "--quiet"]) == 0
    rows = _lines(results)
    assert results.read_text().startswith(kept)  # the first item was not run again
    assert [r.get("id") for r in rows] == [None, "first", "stuck", "last"] and rows[2]["score"] == 1.0
    suite.write_text(suite.read_text().replace('"max_tokens": 1', '"max_tokens": 2'))
    assert main([*argv, "--resume", "--quiet"]) == EXIT_USAGE  # the same file, another decoding: not resumed
    assert "different suites or decoding" in capsys.readouterr().err
