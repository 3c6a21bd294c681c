"""Prompts built ahead of the schedule, in request order, with at most `ahead` waiting: short
runs get every prompt before the clock starts; long ones (soak) keep a bounded lead instead of
holding hours of prompt text in memory."""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable

from tally.bench.prompts import Prompt, PromptBuilder
from tally.bench.workload import PlannedRequest
from tally.errors import TallyError

AHEAD = 2000  # prompts ready or in preparation at most
PARALLEL = 16  # concurrent builds (each may be two /tokenize calls)


class PromptPreparationError(TallyError):
    """A prompt could not be built (e.g. the server's /tokenize failed mid-run)."""


class PromptFeed:
    def __init__(self, builder: PromptBuilder, requests: Iterable[PlannedRequest],
                 ahead: int = AHEAD, parallel: int = PARALLEL):
        self._builder = builder
        self._requests = iter(requests)
        self._room = asyncio.Semaphore(ahead)
        self._parallel = asyncio.Semaphore(parallel)
        self._futures: dict[int, asyncio.Future[Prompt]] = {}
        self._tasks: set[asyncio.Task] = set()
        self._producer: asyncio.Task | None = None
        self._submitted = 0  # requests handed to a build task so far

    def _future(self, request_id: int) -> asyncio.Future[Prompt]:
        if request_id not in self._futures:
            self._futures[request_id] = asyncio.get_running_loop().create_future()
        return self._futures[request_id]

    async def _build(self, request: PlannedRequest) -> None:
        future = self._future(request.id)
        async with self._parallel:
            try:
                prompt = await self._builder.build(request.prompt_tokens, request.corpus_start,
                                                   request.shared_prefix)
            except Exception as exc:  # noqa: BLE001 - handed to whoever waits for this prompt
                if not future.done():
                    future.set_exception(PromptPreparationError(
                        f"building the prompt of request {request.id} failed: {exc}"))
                return
        if not future.done():
            future.set_result(prompt)

    async def _produce(self) -> None:
        for request in self._requests:
            await self._room.acquire()
            task = asyncio.create_task(self._build(request))
            self._submitted += 1
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def start(self, ready: int) -> None:
        """Starts building and returns once the first `ready` prompts exist (fewer if the
        requests end sooner); a failed build raises here rather than mid-run."""
        self._producer = asyncio.create_task(self._produce())
        for request_id in range(ready):
            future = self._future(request_id)
            while not future.done():
                if self._producer.done() and request_id >= self._submitted:
                    del self._futures[request_id]  # the requests ended before this id
                    return
                pending = [future] if self._producer.done() else [future, self._producer]
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            future.result()

    async def get(self, request_id: int) -> Prompt:
        """The prompt of request `request_id` (waits if it is not built yet)."""
        prompt = await self._future(request_id)
        del self._futures[request_id]
        self._room.release()
        return prompt

    async def close(self) -> None:
        for task in [self._producer, *self._tasks]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for future in self._futures.values():  # unused prompts: settle them quietly
            if future.done() and not future.cancelled():
                future.exception()
            else:
                future.cancel()
        self._futures.clear()
