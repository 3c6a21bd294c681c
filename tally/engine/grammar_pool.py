"""The server's grammar compiles, off the engine thread: a request's structured-output spec is compiled once for all
its prompts and samples, on a small pool of threads, within the time limit of tally/engine/grammar_limits.py; the
engine loop only copies the compiled matcher. llguidance leaves the GIL to the other threads while it compiles, and
these threads run below the engine's priority (what the largest spec the limits admit costs a request beside it is
measured in docs/server.md, "What one request may ask for")."""
from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from tally.engine.structured_output import CompiledGrammar, GrammarCompiler
from tally.errors import InvalidRequestError
from tally.sampling_params import SamplingParams

COMPILE_THREADS = 2  # one slow compile leaves a thread for the next request's
COMPILE_NICENESS = 10  # below the engine's threads: a long compile takes the CPU time the engine leaves


class GrammarPool:
    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="tally-grammar",
                                            initializer=_lower_priority)

    async def compile(self, compiler: GrammarCompiler,
                      params: list[SamplingParams]) -> tuple[CompiledGrammar | None, ...]:
        """The compiled grammar of each params' spec (None where it has none), each distinct spec compiled once.
        A 400 naming compile_timeout_s when they take longer; the compile goes on and lands in the cache."""
        loop = asyncio.get_running_loop()
        pending: dict[int, asyncio.Future[CompiledGrammar]] = {}
        for p in params:
            spec = p.structured_outputs
            if spec is not None and id(spec) not in pending:
                pending[id(spec)] = loop.run_in_executor(self._executor, compiler.compile, spec)
        timeout_s = compiler.limits.compile_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                done = {key: await future for key, future in pending.items()}
        except TimeoutError:
            kind = next(p.structured_outputs.kind for p in params if p.structured_outputs is not None)
            raise InvalidRequestError(
                f"structured output {kind} did not compile within {timeout_s:g} s (compile_timeout_s of the server's "
                f"--structured-outputs-config); make it smaller or simpler", param="structured_outputs") from None
        return tuple(None if p.structured_outputs is None else done[id(p.structured_outputs)] for p in params)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _lower_priority() -> None:
    """Linux gives each thread its own nice value (setpriority on its thread id); elsewhere this does nothing."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), COMPILE_NICENESS)
    except (AttributeError, OSError):
        pass
