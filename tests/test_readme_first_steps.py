"""The README's first steps as a newcomer runs them: `make run` (`tally serve` on the built-in model), the first
request of "Serve a model" sent as written with the official openai client, and the first `tally bench` command of
"Load-test" (stopped by --time-limit: its full schedule is a minute). Each is bounded by a generous timeout, so the
README cannot regress into a first request that runs for minutes; a chat that leaves max_tokens out ends at the
built-in model's default instead of the end of the context."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from tally.models.registry import ALIASES
from tally.prometheus_text import histogram_increase, parse
from tally.server.process import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
README_URL = "http://127.0.0.1:8000"
FIRST_REQUEST_TIMEOUT_S = 60.0  # seconds, generous: on two cores the README's request takes a few
UNSET_MAX_TOKENS_TIMEOUT_S = 120.0  # a whole default-length answer on a busy two-core machine
BENCH_TIME_LIMIT = "8s"
BENCH_TIMEOUT_S = 120.0
BUILTIN_MAX_NEW_TOKENS = ALIASES["smollm2-135m"].generation_config["max_new_tokens"]


def readme_commands(section: str) -> list[list[str]]:
    """The shell commands of a README section's first bash block, continuation lines joined, comments dropped."""
    text = (ROOT / "README.md").read_text()
    start = text.index(section)
    block = re.search(r"```bash\n(.*?)```", text[start:], re.S).group(1).replace("\\\n", " ")
    return [argv for line in block.splitlines() if (argv := shlex.split(line, comments=True))]


def first_request() -> tuple[str, dict]:
    """The URL path and the JSON body of the README's first curl."""
    curl = next(argv for argv in readme_commands("**1. Serve a model**") if argv[0] == "curl")
    url = next(a for a in curl if a.startswith(README_URL))
    return url.removeprefix(README_URL), json.loads(curl[curl.index("-d") + 1])


@pytest.fixture(scope="module")
def server():
    with ServerProcess(["--log-level", "warning"]) as s:  # `make run`: the built-in model, default flags
        yield s


def test_the_readmes_first_request_returns_within_a_minute(server):
    path, body = first_request()
    assert path == "/v1/chat/completions" and "max_tokens" in body
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", timeout=FIRST_REQUEST_TIMEOUT_S,
                           max_retries=0)
    answer = client.chat.completions.create(**body)
    assert answer.choices[0].message.content
    assert answer.usage.completion_tokens <= body["max_tokens"]


def test_a_chat_without_max_tokens_ends_at_the_builtin_default(server):
    _, body = first_request()
    body.pop("max_tokens")
    before = parse(httpx.get(server.url + "/metrics").text)
    response = httpx.post(server.base_url + "/chat/completions", json=body, timeout=UNSET_MAX_TOKENS_TIMEOUT_S)
    assert response.status_code == 200, response.text
    assert 0 < response.json()["usage"]["completion_tokens"] <= BUILTIN_MAX_NEW_TOKENS
    allowed = histogram_increase(before, parse(httpx.get(server.url + "/metrics").text), "request_params_max_tokens")
    assert (allowed.count, allowed.sum) == (1, BUILTIN_MAX_NEW_TOKENS)  # what the request was allowed, not 8k


def test_the_readmes_first_bench_runs_and_reports_in_words(server, tmp_path):
    bench = next(argv for argv in readme_commands("**4. Load-test") if argv[:2] == [".venv/bin/tally", "bench"])
    args = [a.replace(README_URL, server.url) for a in bench[2:]]
    done = subprocess.run([sys.executable, "-m", "tally.cli", "bench", *args, "--time-limit", BENCH_TIME_LIMIT],
                          cwd=tmp_path, capture_output=True, text=True, timeout=BENCH_TIMEOUT_S,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})  # this checkout's tally, from any folder
    assert done.returncode == 3, done.stderr[-3000:]  # 3: stopped by --time-limit, the reports written
    result = json.loads((tmp_path / "run.json").read_text())
    assert result["partial"] and result["summary"]["counts"]["ok"] > 0
    assert (tmp_path / "report.html").is_file()
    report = done.stdout
    assert "goodput under TTFT ≤ 2 s, TPOT ≤ 100 ms:" in report
    assert not re.search(r"\{'|\['|\('|\{\}", report), report  # no Python dict, list or tuple reaches the reader
