"""One of tally's modules run as a child process that talks with its parent over two pipes: it imports the same tally
as its parent, may run at a lower CPU priority (its work then takes only the CPU time the server's engine leaves), and
exits when its parent does. The parent holds a `WorkerProcess`; the child calls `worker_pipes` and `started`."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path

from tally.errors import TallyError

START_TIMEOUT_S = 60.0  # a worker imports in a tenth of a second or so, far longer on a crowded machine
_STARTED = b"started"
_TALLY_ROOT = str(Path(__file__).resolve().parents[2])


class WorkerProcess:
    """`python -m module <read fd> <write fd> *args`, `niceness` added to its nice value from its first instruction
    on (Unix)."""

    def __init__(self, module: str, args: list[str], niceness: int = 0) -> None:
        from_parent, to_worker = os.pipe()  # (read end, write end)
        from_worker, to_parent = os.pipe()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (_TALLY_ROOT, os.environ.get("PYTHONPATH"))))}
        try:
            self.proc = subprocess.Popen([sys.executable, "-P", "-m", module, str(from_parent), str(to_parent), *args],
                                         pass_fds=(from_parent, to_parent), stdin=subprocess.DEVNULL, env=env)
        finally:
            os.close(from_parent)
            os.close(to_parent)
        if niceness:
            with contextlib.suppress(ProcessLookupError):  # one that died at once is found out by wait_started
                os.setpriority(os.PRIO_PROCESS, self.proc.pid, os.getpriority(os.PRIO_PROCESS, 0) + niceness)
        self.send, self.receive = Connection(to_worker, readable=False), Connection(from_worker, writable=False)
        self.alive, self._started = True, False

    def wait_started(self, what: str) -> None:
        """Returns once the worker said `started`; TallyError naming `what` if it does not in START_TIMEOUT_S."""
        if self._started:
            return
        try:
            ready = self.receive.poll(START_TIMEOUT_S) and self.receive.recv_bytes() == _STARTED
        except (OSError, EOFError):  # it exited while starting
            ready = False
        if not ready:
            self.close()
            raise TallyError(f"{what} did not start within {START_TIMEOUT_S:g} s; see the server's log")
        self._started = True

    def close(self) -> None:
        self.alive = False
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.send.close()
        self.receive.close()


def worker_pipes(argv: list[str]) -> tuple[Connection, Connection, list[str]]:
    """The child's side, from its command line: (inbox, outbox, the rest of its arguments)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the server's to handle; it closes the pipe
    threading.Thread(target=_exit_with, args=(os.getppid(),), daemon=True).start()
    return Connection(int(argv[0]), writable=False), Connection(int(argv[1]), readable=False), argv[2:]


def started(outbox: Connection) -> None:
    outbox.send_bytes(_STARTED)


def _exit_with(parent_pid: int) -> None:
    """A worker busy for hours must not outlive a server that was killed (its pipe is read only between jobs)."""
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os._exit(0)
