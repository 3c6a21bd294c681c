"""`tally serve` as a child process on a free local port, for tests and benchmarks that need a real
server: start, wait for /health, stop with SIGTERM (the drain path) and report the exit code."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import httpx

from tally.ports import free_port


class ServerProcess:
    """`args` are `tally serve`'s; `command(port)`, when given, starts another OpenAI-compatible server instead
    (benchmarks against a peer), healthy once `health_path` answers 200."""

    def __init__(self, args: list[str], startup_timeout_s: float = 300.0,
                 command: Callable[[int], list[str]] | None = None, health_path: str = "/health",
                 env: dict[str, str] | None = None, base_env: dict[str, str] | None = None) -> None:
        """`env`: variables added to `base_env` (default: this process's environment) for the server."""
        self.args = list(args)
        self.env = {**(os.environ if base_env is None else base_env), "PYTHONUNBUFFERED": "1", **(env or {})}
        self.command = command
        self.health_path = health_path
        self.startup_timeout_s = startup_timeout_s
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self._log = tempfile.NamedTemporaryFile("w+", prefix="tally-serve-", suffix=".log", delete=False)

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def start(self) -> "ServerProcess":
        cmd = self.command(self.port) if self.command else [
            sys.executable, "-m", "tally.cli", "serve", *self.args, "--host", "127.0.0.1", "--port", str(self.port)]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=self.env)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{cmd[0]} exited with {self.proc.returncode} during start-up:\n{self.log()}")
            try:
                if httpx.get(self.url + self.health_path, timeout=2.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{cmd[0]} was not healthy after {self.startup_timeout_s:.0f} s:\n{self.log()}")

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM (drain), then SIGKILL if it does not exit in time; returns the exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def log(self) -> str:
        self._log.flush()
        with open(self._log.name) as f:
            return f.read()[-8000:]

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        os.unlink(self._log.name)
