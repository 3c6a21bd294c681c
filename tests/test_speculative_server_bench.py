"""Speculation measured on real servers: the adaptive policy's own counters reach /metrics and count what it did (a
bench waits on them until measuring is repaid), and benchmarks/speculative.py --server runs each arm (off, and the
built-in model as its own draft, adaptive) on its own `tally serve`, the draft's giving off's text."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from tally import metric_names as names
from tally.prometheus_text import parse
from tally.server.process import ServerProcess

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "speculative.py"
ADAPTIVE = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


def _counter(url: str, name: str) -> float:
    return sum(v for _, v in parse(httpx.get(url + "/metrics").text).counters.get(name, []))


def test_the_adaptive_policys_counters_reach_metrics_and_count(tiny_llama):
    with ServerProcess([str(tiny_llama), "--served-model-name", "tiny", "--dtype", "float32", "--max-model-len",
                        "256", "--kv-cache-memory", "8MB", "--log-level", "warning",
                        "--speculative-config", json.dumps(ADAPTIVE)]) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)
        counted = []
        for _ in range(2):
            client.completions.create(model="tiny", prompt="abc abc abc abc abc abc", temperature=0, max_tokens=40)
            counted.append({name: _counter(server.url, name) for name in (
                names.SPEC_DECODE_POLICY_STEPS, names.SPEC_DECODE_POLICY_MEASURING_STEPS,
                names.SPEC_DECODE_POLICY_SPECULATING_STEPS, names.SPEC_DECODE_POLICY_LOST_OFF_STEPS,
                names.DECODE_STEP_SECONDS, names.DECODE_STEP_TOKENS)})
    first, second = counted
    steps = first[names.SPEC_DECODE_POLICY_STEPS]
    assert 16 <= steps <= 40  # the off epoch's 8 steps and the on epoch's, out of at most one a token
    assert 0 < first[names.SPEC_DECODE_POLICY_MEASURING_STEPS] <= steps
    assert first[names.SPEC_DECODE_POLICY_SPECULATING_STEPS] <= steps
    assert first[names.SPEC_DECODE_POLICY_LOST_OFF_STEPS] >= 0
    assert first[names.DECODE_STEP_SECONDS] > 0 and 0 < first[names.DECODE_STEP_TOKENS] <= 40
    assert second[names.SPEC_DECODE_POLICY_STEPS] > steps
    assert second[names.DECODE_STEP_TOKENS] > first[names.DECODE_STEP_TOKENS]


@pytest.mark.slow
def test_the_server_mode_bench_runs_each_arm_on_its_own_server_with_offs_text():
    run = subprocess.run([sys.executable, str(SCRIPT), "--server", "--workloads", "chat", "--concurrency", "1",
                          "--max-tokens", "8", "--rounds", "1", "--min-requests", "1", "--requests-per-slot", "1",
                          "--warm-steps", "0", "--draft-model", "smollm2-135m", "--arms", "draft adaptive",
                          "--kv-cache-memory", str(256 << 20), "--aa"], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    warmed = re.findall(r"(?m)^chat +C=1 +(.+?) +warmed for \d+ steps / \d+ seconds", run.stdout)
    assert warmed == ["draft adaptive"]
    rows = re.findall(r"(?m)^\| chat \| 1 \| (.+?) \|.*\| (\d+)% \|$", run.stdout)
    assert rows == [("off", "100"), ("draft adaptive", "100"), ("off again", "100")]  # --aa: a second off server
    assert "command: python benchmarks/speculative.py" in run.stdout and "--server" in run.stdout
