"""Chat templates rendered in worker processes with a memory limit and a deadline. A template is code (a request's,
or a model repository's), and neither the Jinja sandbox nor a thread can stop one that loops for hours or allocates
gigabytes: a worker past its deadline is killed and replaced, one past its memory limit fails alone, and the caller
gets TemplateLimitError naming the bound. A request's own template (--trust-request-chat-template) renders in workers
of its own at the lowest CPU priority. `python -m tally.models.template_workers` is one worker."""
from __future__ import annotations

import json
import resource
import sys
import threading
from dataclasses import asdict, dataclass, replace
from multiprocessing.connection import Connection

from tally.models.template_sandbox import TemplateJob, TemplateLimitError, TemplateRejected, render
from tally.models.worker_process import WorkerProcess, started, worker_pipes

GiB = 2**30
REQUEST_TEMPLATE_NICENESS = 19


@dataclass(frozen=True)
class TemplateLimits:
    timeout_s: float = 2.0  # a template renders in about a millisecond
    memory_bytes: int = GiB
    max_output_chars: int = 32 * 2**20
    niceness: int = 0  # added to a worker's nice value (Unix): 19 is the lowest priority

    @classmethod
    def for_body_limit(cls, max_body_bytes: int) -> TemplateLimits:
        """Room for a conversation as large as the body limit allows: its text written twice, and the copies that
        decoding and joining make."""
        return cls(memory_bytes=max(GiB, 32 * max_body_bytes), max_output_chars=2 * max_body_bytes)

    def for_requests(self) -> TemplateLimits:
        """A request's own template: nobody vetted it, so it renders on the CPU time the engine leaves (a template
        that loops to its deadline then costs the other requests nothing)."""
        return replace(self, niceness=REQUEST_TEMPLATE_NICENESS)


class TemplateWorkers:
    """Up to `max_workers` renderings at once, each in its own process; `render` blocks, so call it from a thread."""

    def __init__(self, limits: TemplateLimits = TemplateLimits(), max_workers: int = 4) -> None:
        self.limits = limits
        self.max_workers = max_workers
        self._idle: list[_Worker] = []
        self._count = 0  # idle and busy
        self._closed = False
        self._changed = threading.Condition()

    def start(self) -> None:
        """One worker ahead of the first request, so that it does not wait for a process to start."""
        self._release(self._acquire())

    def render(self, job: TemplateJob) -> str:
        """Raises TemplateLimitError (a bound exceeded: the message names it) or TemplateRejected."""
        payload = json.dumps(asdict(job), ensure_ascii=False).encode("utf-8", "surrogatepass")
        worker = self._acquire()
        try:
            return worker.render(payload, self.limits)
        finally:
            self._release(worker)

    def close(self) -> None:
        with self._changed:
            self._closed = True
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.close()

    def _acquire(self) -> _Worker:
        with self._changed:
            while not self._idle and self._count >= self.max_workers:
                self._changed.wait()
            if self._idle:
                return self._idle.pop()
            self._count += 1
        try:
            return _Worker(self.limits)
        except BaseException:
            self._forget()
            raise

    def _release(self, worker: _Worker) -> None:
        with self._changed:
            if worker.alive and not self._closed:
                self._idle.append(worker)
                self._changed.notify()
                return
        worker.close()
        self._forget()

    def _forget(self) -> None:
        with self._changed:
            self._count -= 1
            self._changed.notify()


class _Worker(WorkerProcess):
    def __init__(self, limits: TemplateLimits) -> None:
        super().__init__(__spec__.name, [str(limits.memory_bytes), str(limits.max_output_chars)], limits.niceness)

    def render(self, payload: bytes, limits: TemplateLimits) -> str:
        self.wait_started("a chat template worker")
        try:
            self.send.send_bytes(payload)
            if not self.receive.poll(limits.timeout_s):
                self.close()
                raise TemplateLimitError(f"the chat template took longer than {limits.timeout_s:g} s to render, the "
                                         "limit on a template")
            kind, _, text = self.receive.recv_bytes().partition(b"\n")
        except (OSError, EOFError):  # the worker died: only the kernel kills one (over its memory, its stack)
            self.close()
            raise TemplateLimitError(_memory_message(limits)) from None
        if kind == b"ok":
            return text.decode("utf-8", "surrogatepass")
        message = text.decode("utf-8", "replace")
        if kind == b"limit":
            raise TemplateLimitError(message)
        if kind == b"memory":
            raise TemplateLimitError(_memory_message(limits))
        raise TemplateRejected(message)


def _memory_message(limits: TemplateLimits) -> str:
    return f"the chat template needed more than {limits.memory_bytes / GiB:g} GiB of memory, the limit on a template"


def _serve(inbox: Connection, outbox: Connection, memory_bytes: int, max_output_chars: int) -> None:
    """One worker's life: render each job its parent sends until the parent closes the pipe or dies."""
    hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
    resource.setrlimit(resource.RLIMIT_DATA, (memory_bytes if hard == resource.RLIM_INFINITY else
                                              min(memory_bytes, hard), hard))
    started(outbox)
    while True:
        try:
            job = TemplateJob(**json.loads(inbox.recv_bytes().decode("utf-8", "surrogatepass")))
        except EOFError:
            return
        out_of_memory = False
        try:
            reply = b"ok\n" + render(job, max_output_chars).encode("utf-8", "surrogatepass")
        except TemplateLimitError as exc:
            reply = b"limit\n" + str(exc).encode()
        except TemplateRejected as exc:
            reply = b"rejected\n" + str(exc).encode("utf-8", "replace")
        except MemoryError:
            out_of_memory = True  # answered below, once the traceback no longer holds what filled the memory
        del job
        outbox.send_bytes(b"memory\n" if out_of_memory else reply)


if __name__ == "__main__":
    _inbox, _outbox, _args = worker_pipes(sys.argv[1:])
    _serve(_inbox, _outbox, *map(int, _args))
