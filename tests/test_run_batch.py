"""`tally run-batch` on a real OpenAI batch file: each line answered as `tally serve` would answer it (errors as the
server's 4xx, in the line's result), progress on stderr, and a rerun that runs only the lines the output lacks."""
from __future__ import annotations

import json

import pytest

from tally.cli import main

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 6, "temperature": 0}
COMPLETION = {"model": "tiny", "prompt": "The quick brown fox", "max_tokens": 8, "temperature": 0}


def _line(custom_id: str, url: str, body: dict) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body}) + "\n"


def _results(path) -> dict[str, dict]:
    """The complete result lines, by custom_id (a line a crash cut short is not one)."""
    results = {}
    for text in path.read_text().splitlines():
        try:
            result = json.loads(text)
        except ValueError:
            continue
        results[result["custom_id"]] = result
    return results


def test_a_batch_file_runs_and_resumes(tiny_llama, tmp_path, capsys):
    requests, results = tmp_path / "requests.jsonl", tmp_path / "results.jsonl"
    argv = ["run-batch", "-i", str(requests), "-o", str(results), "--model", str(tiny_llama), "--served-model-name",
            "tiny", "--dtype", "float32", "--max-model-len", "128", "--kv-cache-memory", "8MB"]
    requests.write_text(_line("chat", "/v1/chat/completions", CHAT) + _line("fox", "/v1/completions", COMPLETION)
                        + _line("fox-again", "/v1/completions", COMPLETION)
                        + _line("urgent", "/v1/completions", {**COMPLETION, "priority": 1}))
    assert main(argv) == 0
    first = _results(results)
    assert set(first) == {"chat", "fox", "fox-again", "urgent"}
    chat = first["chat"]["response"]
    assert chat["status_code"] == 200 and first["chat"]["error"] is None
    assert chat["body"]["object"] == "chat.completion" and chat["request_id"] == chat["body"]["id"]
    assert chat["body"]["usage"]["completion_tokens"] <= 6
    # the same greedy answer whatever ran beside it
    assert first["fox"]["response"]["body"]["choices"][0]["text"] == \
        first["fox-again"]["response"]["body"]["choices"][0]["text"]
    urgent = first["urgent"]  # refused as the server refuses it: this engine serves first come, first served
    assert urgent["response"]["status_code"] == 400 and "--scheduling-policy priority" in urgent["error"]["message"]
    assert urgent["response"]["body"]["error"]["param"] == "priority"
    assert "4/4 done, 1 failed" in capsys.readouterr().err

    # a crash cut the last result short; the rerun keeps what is there and runs what is not
    with results.open("a") as out:
        out.write('{"id": "batch_req_x", "custom_id": "streamed", "resp')
    with requests.open("a") as f:
        f.write(_line("streamed", "/v1/chat/completions", {**CHAT, "stream": True})
                + _line("unknown-field", "/v1/completions", {**COMPLETION, "suffix": "!"})
                + _line("urgent-now", "/v1/completions", {**COMPLETION, "priority": -1}))
    argv += ["--scheduling-policy", "priority"]
    assert main(argv) == 0
    assert "7 requests, 4 already in" in capsys.readouterr().err
    second = _results(results)
    assert {k: second[k] for k in first} == first
    assert second["urgent-now"]["response"]["body"]["choices"] == first["fox"]["response"]["body"]["choices"]
    assert second["streamed"]["error"]["message"].startswith("stream:")
    assert second["unknown-field"]["response"]["status_code"] == 400
    assert second["unknown-field"]["response"]["body"]["error"]["param"] == "suffix"
    assert main(argv) == 0  # nothing left to run: the model is not even loaded
    assert "7 requests, 7 already in" in capsys.readouterr().err


@pytest.mark.parametrize("text,message", [
    ("not json\n", "is not JSON"),
    ('{"custom_id": "a", "url": "/v1/completions", "body": {}}\n', "lacks method"),
    (_line("a", "/v1/completions", COMPLETION) * 2, "custom_id 'a' is used twice"),
    (_line("a", "/health", {}), "url a /v1/ route"),
])
def test_a_bad_batch_file_is_refused_naming_its_line(tmp_path, capsys, text, message):
    requests = tmp_path / "requests.jsonl"
    requests.write_text(text)
    assert main(["run-batch", "-i", str(requests), "-o", str(tmp_path / "out.jsonl"), "--model", "unused"]) == 2
    err = capsys.readouterr().err
    assert f"{requests}:" in err and message in err
