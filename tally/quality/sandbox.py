"""Run a model's Python code against its tests in a subprocess with CPU time, memory and file-size limits, a fresh
temporary directory as its working directory, and no network; what each guarantee rests on is in docs/quality.md.

With Linux namespaces available to an unprivileged user (`unshare -rnmpf`), the network is an empty namespace, the
file system is read-only outside the temporary directory, and every process the code starts dies with it; without
them, sockets are refused in the interpreter (best effort) and writes are confined only by convention (cwd, HOME and
TMPDIR point into the directory)."""
from __future__ import annotations

import contextlib
import functools
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

LAUNCHER = Path(__file__).with_name("sandbox_launch.py")
FILE_SIZE_LIMIT_BYTES = 64 << 20  # a program that writes without bound fills the temp dir, not the disk
OPEN_FILES_LIMIT = 256
OUTPUT_TAIL_CHARS = 400


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 10.0  # wall clock; CPU time is capped at the same figure
    memory_mb: int = 512  # address space (RLIMIT_AS), so it includes the interpreter's own ~30 MB


@dataclass(frozen=True)
class RunResult:
    passed: bool
    reason: str | None  # why not, for the results file: the failing assertion, the limit hit, ...


@functools.cache
def isolation() -> str:
    """`namespace` when this system lets an unprivileged process make user, network, mount and PID namespaces,
    else `sockets`."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return "sockets"
    try:
        ok = subprocess.run([unshare, "-rnmpf", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return "namespace" if ok else "sockets"


def _limit(limits: Limits) -> None:
    """Runs in the child between fork and exec: the limits hold for it and everything it starts."""
    cpu_s = max(1, int(limits.timeout_s + 0.999))
    memory = limits.memory_mb << 20
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT_BYTES, FILE_SIZE_LIMIT_BYTES))
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES_LIMIT, OPEN_FILES_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _last_line(text: str) -> str:
    """The exception's own line, the last of a traceback."""
    lines = text.strip().splitlines()
    line = lines[-1] if lines else ""
    return line if len(line) <= OUTPUT_TAIL_CHARS else line[:OUTPUT_TAIL_CHARS] + "…"


def _why_failed(code: int, stderr: str, limits: Limits) -> str:
    if code in (-signal.SIGXCPU, -signal.SIGKILL):
        return f"killed at its CPU time limit ({limits.timeout_s:g} s)"
    if "MemoryError" in stderr:
        return f"ran out of memory at its limit ({limits.memory_mb} MB)"
    if code == -signal.SIGXFSZ:
        return f"wrote a file over {FILE_SIZE_LIMIT_BYTES >> 20} MB"
    return f"exit code {code}: {_last_line(stderr) or '(no output)'}"


def run_python(program: str, limits: Limits) -> RunResult:
    """`program` (the model's code and the tests after it) passes when it exits 0 within its limits."""
    workdir = Path(tempfile.mkdtemp(prefix="tally-eval-code-"))
    try:
        (workdir / "main.py").write_text(program, encoding="utf-8")
        mode = isolation()
        command = [sys.executable, "-I", str(LAUNCHER), mode, str(workdir)]
        if mode == "namespace":
            command = [shutil.which("unshare") or "unshare", "-rnmpf", *command]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(workdir), "TMPDIR": str(workdir),
               "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
        # stderr into a file, not a pipe: a background child holding a pipe open would make waiting for it hang.
        with tempfile.TemporaryFile() as stderr:
            proc = subprocess.Popen(command, cwd=workdir, env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True,
                                    preexec_fn=functools.partial(_limit, limits))
            try:
                code = proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                code = None
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # its own session: whatever it started goes too
                proc.wait()
            if code is None:
                return RunResult(False, f"killed at its time limit ({limits.timeout_s:g} s)")
            if code == 0:
                return RunResult(True, None)
            stderr.seek(max(0, stderr.seek(0, os.SEEK_END) - 4 * OUTPUT_TAIL_CHARS))
            return RunResult(False, _why_failed(code, stderr.read().decode("utf-8", "replace"), limits))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
