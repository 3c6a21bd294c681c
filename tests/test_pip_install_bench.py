"""`pip install '.[bench]'` into a fresh venv, as a user without make would (with the exact versions of
constraints.txt): torch is not installed, and `tally plan` runs on a model's config.json and `tally bench` against a
real `tally serve` on loopback (started from the development venv). pip reaches the index this machine's pip
configuration names; where it cannot, the test fails saying so, within a bounded time, instead of hanging."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tally.server.process import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
PIP_TIMEOUT_S = 15  # per connection: a missing index fails fast instead of pip's long default
INSTALL_TIMEOUT_S = 600
# What pip needs to build Tally: its sources and the files pyproject.toml names (copied, so the build leaves
# nothing in the working tree)
SOURCES = ("pyproject.toml", "LICENSE", "tally")

pytestmark = pytest.mark.install


def _run(cmd: list[str], what: str, timeout_s: float, **kwargs) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, **kwargs)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{what} did not finish within {timeout_s:.0f} s: {' '.join(cmd)}\n{(exc.stdout or '')[-2000:]}")


@pytest.fixture(scope="module")
def bench_venv(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("pip-install")
    for name in SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, work / "src" / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            (work / "src").mkdir(exist_ok=True)
            shutil.copy2(source, work / "src" / name)
    venv = work / "venv"
    # without a pip of its own: this venv's pip installs into it (--python), the same install less ensurepip's
    # copying of pip into the new venv (a third of this fixture's time)
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], "python -m venv", 120, check=True)
    env = {**os.environ, "PIP_DEFAULT_TIMEOUT": str(PIP_TIMEOUT_S), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("VIRTUAL_ENV", None)
    install = _run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--retries", "1",
                    "-c", str(ROOT / "constraints.txt"), f"{work / 'src'}[bench]"], "pip install .[bench]",
                   INSTALL_TIMEOUT_S, env=env)
    if install.returncode != 0:
        pytest.fail("pip could not install tally[bench] into a fresh venv; is a package index reachable (pip config "
                    "list)? Its last words:\n" + (install.stdout + install.stderr)[-3000:])
    return venv


def test_the_bench_extra_installs_without_torch(bench_venv):
    probe = _run([str(bench_venv / "bin" / "python"), "-c",
                  "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is not None)"],
                 "the torch probe", 60)
    assert probe.returncode == 0, "pip install .[bench] installed torch"


def test_plan_runs_on_a_models_config(bench_venv, tiny_llama):
    plan = _run([str(bench_venv / "bin" / "tally"), "plan", "--model", str(tiny_llama / "config.json"),
                 "--device", "a10", "--max-model-len", "256", "--json"], "tally plan", 120)
    assert plan.returncode == 0, plan.stderr
    result = json.loads(plan.stdout)
    assert result["model"]["num_layers"] == json.loads((tiny_llama / "config.json").read_text())["num_hidden_layers"]


def test_bench_runs_against_tally_serve(bench_venv, tiny_llama, tmp_path):
    with ServerProcess(["--model", str(tiny_llama), "--served-model-name", "tiny", "--dtype", "float32",
                        "--kv-cache-memory", "8MB", "--max-model-len", "256"]) as server:
        bench = _run([str(bench_venv / "bin" / "tally"), "bench", "--url", server.url, "--concurrency", "2",
                      "--requests", "6", "--lengths", "fixed:16,4", "--out", str(tmp_path / "run.json"), "--quiet"],
                     "tally bench", 300)
    assert bench.returncode == 0, bench.stderr
    counts = json.loads((tmp_path / "run.json").read_text())["summary"]["counts"]
    assert counts["ok"] == 6 and counts["failed"] == 0
