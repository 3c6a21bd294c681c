"""Long texts tokenized in a worker process at the lowest CPU priority: the fast tokenizer holds the GIL while it turns
a long text's tokens into Python objects, and so does writing millions of ids as JSON, which would stall the server's
event loop and engine thread for seconds for a text as large as the body limit. The worker loads the same tokenizer
(the tokenizers library's own serialisation of it) and answers with the ids as JSON text, which the server forwards
as it is. `python -m tally.models.tokenizer_worker` is the worker."""
from __future__ import annotations

import asyncio
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

import tokenizers

from tally.errors import TallyError
from tally.models.worker_process import WorkerProcess, started, worker_pipes

if TYPE_CHECKING:
    from tally.models.tokenizer import Tokenizer

LONG_TEXT_CHARS = 65_536  # shorter texts hold the GIL for milliseconds: tokenized in the server's own threads
# The lowest: a text as long as the body limit is many seconds of CPU, which beside the engine at any higher priority
# slows every request it decodes; on a busy server a long text waits for the CPU time the engine leaves.
TOKENIZER_NICENESS = 19


class TokenizerWorker:
    """One worker process, started on first use and kept; texts wait their turn on a thread of its own, so a queue of
    long texts holds none of the threads the rest of the server shares."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._worker: WorkerProcess | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="tally-tokenize")  # the worker's only caller

    async def encode_json(self, text: str, add_special_tokens: bool = True) -> tuple[int, bytes]:
        """(how many tokens, their ids as a JSON array): what `tokenizer.encode(text, add_special_tokens)` gives."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._encode_json, text,
                                                                add_special_tokens)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        if self._worker is not None:
            self._worker.close()

    def _encode_json(self, text: str, add_special_tokens: bool) -> tuple[int, bytes]:
        try:
            if self._worker is None or self._worker.proc.poll() is not None:  # not started yet, or killed idle
                self._worker = WorkerProcess(__spec__.name, [], TOKENIZER_NICENESS)
                self._worker.send.send_bytes(self._tokenizer.backend_tokenizer.to_str().encode())
                self._worker.wait_started("the tokenizer worker")
            self._worker.send.send_bytes((b"1" if add_special_tokens else b"0") + text.encode())
            count, _, ids = self._worker.receive.recv_bytes().partition(b"\n")
        except (OSError, EOFError):  # it was killed: the kernel's OOM killer, an operator, close()
            self._worker.close()
            raise TallyError("the tokenizer worker exited while tokenizing; try again, and see the server's log") \
                from None
        return int(count), ids


def ids_json(ids: list[int]) -> bytes:
    return json.dumps(ids, separators=(",", ":")).encode()


def _serve(inbox: Connection, outbox: Connection) -> None:
    tokenizer = tokenizers.Tokenizer.from_str(inbox.recv_bytes().decode())
    started(outbox)
    while True:
        try:
            job = inbox.recv_bytes()
        except EOFError:
            return
        ids = tokenizer.encode(job[1:].decode(), add_special_tokens=job[:1] == b"1").ids
        outbox.send_bytes(b"%d\n%s" % (len(ids), ids_json(ids)))


if __name__ == "__main__":
    _inbox, _outbox, _ = worker_pipes(sys.argv[1:])
    _serve(_inbox, _outbox)
