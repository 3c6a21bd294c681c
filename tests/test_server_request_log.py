"""`tally serve --request-log DIR`: real traffic, logged as it finishes, drives planning, replay and calibration.
A real server writes the log; the readers of tally plan, tally bench and tally quantize read the directory."""
from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from types import SimpleNamespace

import httpx
import pytest

from tally.cli import main
from tally.ledger.length_percentiles import load_lengths
from tally.models.loader import load_checkpoint
from tally.models.tokenizer import load_tokenizer
from tally.quantize.calibrate import load_calibration
from tally.server.process import ServerProcess
from tally.server.request_log import _EMAIL, LOGGED_TEXT_CHARS, RequestLog, redact
from tally.traces import load_trace


# Every code point str.splitlines() breaks a line at, between words.
LINE_BREAKS = "one\ntwo\rthree\r\nfour\x0bfive\x0csix\x1cseven\x1deight\x1enine\x85ten\u2028eleven\u2029twelve, Zürich"


@pytest.fixture(scope="module")
def logged(tiny_llama, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("requests")
    with ServerProcess(["--model", str(tiny_llama), "--served-model-name", "tiny", "--dtype", "float32",
                        "--max-model-len", "256", "--kv-cache-memory", "8MB", "--request-log", str(log_dir),
                        "--log-prompts", "--request-log-max-bytes", "600"]) as server:
        for i in range(3):
            r = httpx.post(server.base_url + "/completions", json={
                "model": "tiny", "prompt": f"write to bob{i}@example.com about order 4415 2233 9012", "max_tokens": 4 + i})
            assert r.status_code == 200
        r = httpx.post(server.base_url + "/chat/completions", json={
            "model": "tiny", "messages": [{"role": "system", "content": "be brief"},
                                         {"role": "user", "content": "my key is sk-abcdef0123456789xyz"}],
            "max_tokens": 3, "stream": True})
        assert r.status_code == 200
        r = httpx.post(server.base_url + "/chat/completions", json={
            "model": "tiny", "messages": [{"role": "user", "content": LINE_BREAKS}], "max_tokens": 2})
        assert r.status_code == 200
    return log_dir


def _records(log_dir) -> list[dict]:
    return [json.loads(ln) for f in sorted(log_dir.glob("*.jsonl")) for ln in f.read_text().splitlines()]


def test_every_finished_request_is_a_line_with_counts_latencies_and_redacted_text(logged):
    records = _records(logged)
    assert len(records) == 5 and len(list(logged.glob("*.jsonl"))) > 1  # rotated by size
    completions = [r for r in records if r["endpoint"] == "/v1/completions"]
    assert [r["output_tokens"] for r in completions] == [4, 5, 6]
    assert all(r["prompt_tokens"] > 0 and r["finish_reason"] == "length" and r["e2e_s"] >= r["ttft_s"] > 0
               for r in records)
    # only the logged text: a latency's or an id's digits may contain "4415" by chance
    text = json.dumps([{k: r[k] for k in ("prompt", "messages") if k in r} for r in records])
    assert "example.com" not in text and "4415" not in text and "sk-abcdef" not in text
    assert "<email>" in completions[0]["prompt"] and "<number>" in completions[0]["prompt"]
    chat = next(r for r in records if r["endpoint"] == "/v1/chat/completions")
    assert chat["messages"][0] == {"role": "system", "content": "be brief"}
    assert "<key>" in chat["messages"][1]["content"]


def test_plan_bench_and_quantize_read_the_log_directory(logged, tiny_llama):
    trace = load_trace(logged)
    assert len(trace) == 5 and trace.arrival_s is not None and trace.arrival_s[0] == 0.0  # replayable
    assert load_lengths(logged) == trace.pairs()
    tokenizer = load_tokenizer(load_checkpoint(str(tiny_llama)))
    calib = load_calibration(logged, tokenizer)
    assert len(calib.token_ids) == 5 and all(calib.token_ids)


def test_a_prompt_full_of_line_breaks_stays_one_record_for_every_reader(logged, tiny_llama, capsys):
    text = "".join(f.read_text(encoding="utf-8") for f in sorted(logged.glob("*.jsonl")))
    assert len(text.splitlines()) == len(text.split("\n")[:-1]) == 5  # escaped: no reader sees a break inside
    assert "\u2028" not in text and "\\u2028" in text and "Zürich" in text  # escaped one by one, the rest UTF-8
    assert any(r.get("messages") == [{"role": "user", "content": LINE_BREAKS}] for r in _records(logged))
    assert main(["plan", "--model", "Llama-3.1-8B", "--device", "h100-80gb", "--lengths", str(logged)]) == 0
    assert "Lengths (5 requests)" in capsys.readouterr().out
    assert len(load_trace(logged)) == 5  # tally bench --lengths trace:DIR and --replay DIR
    tokenizer = load_tokenizer(load_checkpoint(str(tiny_llama)))
    calib = load_calibration(logged, tokenizer)
    assert any(LINE_BREAKS in tokenizer.decode(ids) for ids in calib.token_ids)


def test_the_default_redaction():
    assert redact("mail a.b+c@mail.co.uk, call +44 20 7946 0958, key api_0123456789abcdef") == \
        "mail <email>, call <number>, key <key>"


# A pattern searched at every position reads each of these runs from each of its positions: hours at this length.
ADVERSARIAL = {
    "a name without an @": "a" * 10**6,
    "a dotted name without an @": "a." * (10**6 // 2),
    "@ after @": "a@" * (10**6 // 2),
    "a domain without a dot": "a@" + "b" * 10**6,
    "addresses back to back": "a@b.c+" * (10**6 // 6),
    "a number that never ends in a digit": "1" + "." * 10**6,
    "key prefixes": "sk-" * (10**6 // 3),
    "key characters without a word": "+/" * (10**6 // 2),
    "words of one accented letter": "é+" * (10**6 // 2),
}


def test_redaction_is_linear_on_inputs_that_make_a_backtracking_search_quadratic():
    code = ("import sys; from tally.server.request_log import redact; import json; "
            "[redact(t) for t in json.loads(sys.stdin.read()).values()]")
    # the timeout only stops a hang: linear redaction of these takes about a second, quadratic hours
    subprocess.run([sys.executable, "-c", code], input=json.dumps(ADVERSARIAL), text=True, check=True, timeout=600)


def test_email_redaction_replaces_what_the_plain_pattern_matches():
    plain = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
    rng = random.Random(0)

    def blank(match: re.Match) -> str:  # the characters replaced, whatever the placeholders
        return "#" * len(match.group())

    for _ in range(20_000):
        text = "".join(rng.choice("ab.+-@ é1") for _ in range(rng.randint(0, 24)))
        assert _EMAIL.sub(blank, text) == plain.sub(blank, text), text


def test_a_request_logs_at_most_a_bounded_text_its_end_kept(tmp_path):
    """Redaction runs on the event loop: a prompt near the body limit must not stall it for seconds."""
    log = RequestLog(tmp_path, log_prompts=True)
    huge = "a." * 2_000_000 + "the end"
    [logged] = log._prompts(SimpleNamespace(prompt=huge), 1)
    assert logged["prompt"].startswith("[3,934,471 characters not logged]") and logged["prompt"].endswith("the end")
    assert len(logged["prompt"]) < LOGGED_TEXT_CHARS + 64
    words = "ab " * (LOGGED_TEXT_CHARS // 3)  # the budget is the request's: the last turn first
    chat = SimpleNamespace(messages=[SimpleNamespace(role="user", text=lambda: words),
                                     SimpleNamespace(role="user", text=lambda: "last")])
    [turns] = log._prompts(chat, 1)
    assert [m["content"] for m in turns["messages"]] == [f"[{len(words) + 4 - LOGGED_TEXT_CHARS} characters not "
                                                         f"logged]{words[len(words) + 4 - LOGGED_TEXT_CHARS:]}", "last"]
