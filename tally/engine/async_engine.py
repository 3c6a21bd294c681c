"""The engine's step loop on its own thread, beside an asyncio server.

The Engine is not thread-safe, so only the loop thread touches it: the server posts add/abort
commands to an inbox that the loop drains between steps, and each step's outputs go back to the
event loop in one `call_soon_threadsafe`. Torch releases the GIL inside its kernels, so HTTP work
on the event loop overlaps the forward pass (docs/server.md has the thread-vs-process measurement)."""
from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from dataclasses import dataclass

from tally.engine import frozen_heap
from tally.engine.engine import Engine
from tally.engine.grammar_pool import GrammarPool
from tally.engine.heap_trim import HeapTrimmer
from tally.engine.load_engine import load_engine
from tally.engine.queue_delay import QueueDelay
from tally.engine.snapshot import EngineSnapshot
from tally.engine.stats_log import StatsLog
from tally.engine.structured_output import CompiledGrammar, GrammarCompiler
from tally.errors import EngineDeadError, InvalidRequestError, QueueFullError, TallyError
from tally.lora_request import LoRARequest
from tally.outputs import RequestOutput
from tally.sampling_params import MAX_N, SamplingParams

log = logging.getLogger("tally.engine.async")

MAX_CONSECUTIVE_STEP_FAILURES = 3  # a step that keeps raising means the engine itself is broken


@dataclass(frozen=True)
class AddRequests:
    """Queue one HTTP request's engine requests; `stream` receives their outputs."""

    stream: RequestStream
    items: list[tuple[str, object, SamplingParams]]  # (engine request id, prompt, params)
    arrival_time: float
    num_seqs: int
    grammars: tuple[CompiledGrammar | None, ...] = ()  # per item, compiled on the grammar pool; () for none
    priority: int = 0  # --scheduling-policy priority: lower runs sooner
    lora_request: LoRARequest | None = None  # the LoRA adapter every item runs with; None: the base model


@dataclass(frozen=True)
class AbortRequests:
    request_ids: list[str]


Command = AddRequests | AbortRequests


class RequestStream:
    """Where one HTTP request's engine requests (one per prompt) deliver their outputs.

    Outputs are cumulative, so the reader only needs the latest of each: a slow reader skips
    intermediate outputs instead of queueing them, and never falls behind the engine."""

    def __init__(self, request_ids: list[str]) -> None:
        self.request_ids = request_ids
        self.accepted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._latest: dict[str, RequestOutput] = {}
        self._changed = asyncio.Event()
        self._error: BaseException | None = None

    def _put(self, out: RequestOutput) -> None:
        self._latest[out.request_id] = out
        self._changed.set()

    def fail(self, exc: BaseException) -> None:
        """Ends the wait of whoever awaits this stream with `exc` (also used for disconnects, timeouts)."""
        if not self.accepted.done():
            self.accepted.set_exception(exc)
        self._error = exc
        self._changed.set()

    async def next(self) -> dict[str, RequestOutput]:
        """Waits for news, then returns the latest output of every engine request heard from."""
        await self._changed.wait()
        self._changed.clear()
        if self._error is not None:
            raise self._error
        return dict(self._latest)

    def is_finished(self, latest: dict[str, RequestOutput] | None = None) -> bool:
        """Whether `latest` (a result of next(); default: now) holds the final output of every request.
        Judge a result of next() by itself: newer outputs may have arrived since it was taken."""
        latest = self._latest if latest is None else latest
        return len(latest) == len(self.request_ids) and all(o.finished for o in latest.values())


class AsyncEngine:
    def __init__(self, engine: Engine, max_queue: int | None = None, restart_on_failure: bool = False,
                 max_queue_delay_s: float | None = None) -> None:
        """restart_on_failure: when the loop dies, the requests in flight fail with EngineDeadError, the server
        answers 503 while a fresh Engine loads from the same config, then it serves again. max_queue_delay_s:
        refuse a request whose predicted wait for a batch slot (tally/engine/queue_delay.py) is longer."""
        self.engine = engine
        self.restart_on_failure = restart_on_failure
        self.restarts = 0
        self.max_queue = max_queue  # engine requests allowed to wait for a batch slot
        self.max_queue_delay_s = max_queue_delay_s
        self._queue_delay = QueueDelay()
        self._max_num_seqs = engine.config.max_num_seqs
        self.snapshot = EngineSnapshot()
        self._stats_log = None if engine.config.disable_log_stats else StatsLog()
        self.heap_trimmer = HeapTrimmer()
        self._inbox: deque[Command] = deque()
        self._lock = threading.Lock()  # guards _inbox, _pending_adds and snapshot together
        self._pending_adds = 0
        self._compiling = 0  # engine requests whose grammars compile before they reach the inbox
        self._grammar_pool = GrammarPool()
        self._compiles: set[asyncio.Task] = set()  # event-loop thread only
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._routes: dict[str, RequestStream] = {}  # event-loop thread only
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.alive = False

    # -- lifecycle (event loop thread) ---------------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._publish()
        self.alive = True
        frozen_heap.freeze()  # the loaded engine and the app: no collector pause walks them while serving
        self._thread = threading.Thread(target=self._run, name="tally-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._grammar_pool.shutdown()
        if self.engine is not None and (self._thread is None or not self._thread.is_alive()):
            self.engine.shutdown()  # a tensor-parallel engine's other ranks
        frozen_heap.thaw()

    @property
    def is_alive(self) -> bool:
        return self.alive and self._thread is not None and self._thread.is_alive()

    def queue_depth(self) -> int:
        """Engine requests that cannot start now: those not yet running (in the inbox or the scheduler's queue)
        beyond the batch slots and KV blocks free at the last step."""
        with self._lock:
            return self._queued()

    def _queued(self, arriving: int = 0) -> int:
        s = self.snapshot
        startable = min(self._max_num_seqs - s.num_running, s.num_free_blocks)
        return max(0, self._pending_adds + self._compiling + s.num_waiting + arriving - startable)

    def check_fan_out(self, num_prompts: int, num_seqs: int) -> None:
        """400 when one request asks for more sequences (prompts × n) than one request may: the larger of
        --max-num-seqs and n's own cap, and never more than --max-queue could ever admit beside a full batch."""
        limit, why = max(self._max_num_seqs, MAX_N), f"the larger of --max-num-seqs and {MAX_N}"
        if self.max_queue is not None and self._max_num_seqs + self.max_queue < limit:
            limit, why = self._max_num_seqs + self.max_queue, "--max-num-seqs + --max-queue"
        if num_seqs > limit:
            raise InvalidRequestError(
                f"this request asks for {num_seqs:,} sequences ({num_prompts:,} prompt(s) × n); one request may ask "
                f"for at most {limit:,} ({why}); send fewer prompts or a smaller n per request",
                param="prompt" if num_prompts > 1 else "n")

    # -- requests (event loop thread) ----------------------------------------------------------
    def submit(self, items: list[tuple[str, object, SamplingParams]], arrival_time: float,
               priority: int = 0, lora_request: LoRARequest | None = None) -> RequestStream:
        """Queues engine requests (request id, prompt, params); one stream receives all their outputs.

        Raises QueueFullError at once when admitting them would overflow --max-queue; errors of
        add_request (bad prompt, too long) arrive through `stream.accepted`."""
        if not self.is_alive:
            raise EngineDeadError("the engine loop has stopped; see the server log for why")
        n_seqs = sum(p.n for _, _, p in items)
        self.check_fan_out(len(items), n_seqs)
        stream = RequestStream([rid for rid, _, _ in items])
        compiler = self.engine.grammars if any(p.structured_outputs is not None for _, _, p in items) else None
        with self._lock:
            depth = self._queued()
            if self.max_queue is not None and self._queued(n_seqs) > self.max_queue:
                raise QueueFullError(
                    f"the server's waiting queue is full ({depth} of --max-queue {self.max_queue} waiting; this "
                    f"request brings {n_seqs}); retry after a moment", retry_after_s=1.0)
            wait_s = self._queue_delay.predicted_wait_s(depth + n_seqs) if depth > 0 else 0.0
            if self.max_queue_delay_s is not None and wait_s > self.max_queue_delay_s:
                shown = "no request started lately" if wait_s == float("inf") else f"about {wait_s:.0f} s"
                raise QueueFullError(
                    f"a batch slot would take too long to free ({shown}; --max-queue-delay "
                    f"{self.max_queue_delay_s:g} s); retry later", retry_after_s=min(wait_s, 60.0))
            if compiler is not None:
                self._compiling += n_seqs
            else:
                self._pending_adds += n_seqs
                self._inbox.append(AddRequests(stream, items, arrival_time, n_seqs, priority=priority,
                                               lora_request=lora_request))
        for rid in stream.request_ids:
            self._routes[rid] = stream
        if compiler is not None:
            task = asyncio.ensure_future(self._compile_then_add(compiler, stream, items, arrival_time, n_seqs,
                                                                priority, lora_request))
            self._compiles.add(task)
            task.add_done_callback(self._compiles.discard)
        self._wake.set()
        return stream

    async def _compile_then_add(self, compiler: GrammarCompiler, stream: RequestStream,
                                items: list[tuple[str, object, SamplingParams]], arrival_time: float,
                                n_seqs: int, priority: int, lora_request: LoRARequest | None) -> None:
        """The request's grammars compiled off the engine thread, then the request queued as any other; a spec that
        is too large, invalid or too slow to compile fails its stream (400)."""
        error: BaseException | None = None
        try:
            grammars = await self._grammar_pool.compile(compiler, [p for _, _, p in items])
        except Exception as exc:  # noqa: BLE001 - the request's own problem
            error = exc if isinstance(exc, TallyError) else _internal(exc)
        with self._lock:
            self._compiling -= n_seqs
            # a client gone, a timeout or a dead engine while it compiled: nobody waits for it any more
            wanted = error is None and self.alive and self._routes.get(stream.request_ids[0]) is stream
            if wanted:
                self._pending_adds += n_seqs
                self._inbox.append(AddRequests(stream, items, arrival_time, n_seqs, grammars, priority, lora_request))
        if error is not None:
            self._fail(stream.request_ids, error)
        self._wake.set()

    def abort(self, stream: RequestStream) -> None:
        """Frees the stream's engine requests before the next step; their outputs go nowhere."""
        for rid in stream.request_ids:
            self._routes.pop(rid, None)
        with self._lock:
            self._inbox.append(AbortRequests(stream.request_ids))
        self._wake.set()

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            stream = self._routes.get(out.request_id)
            if stream is None:
                continue
            stream._put(out)
            if out.finished:
                del self._routes[out.request_id]

    def _fail(self, request_ids: list[str], exc: BaseException) -> None:
        for rid in request_ids:
            stream = self._routes.pop(rid, None)
            if stream is not None:
                stream.fail(exc)

    def _fail_all(self, exc: BaseException) -> None:
        self._fail(list(self._routes), exc)

    def _accept(self, stream: RequestStream, exc: BaseException | None) -> None:
        if stream.accepted.done():
            return
        if exc is None:
            stream.accepted.set_result(None)
        else:
            self._fail(stream.request_ids, exc)

    # -- the loop (engine thread) --------------------------------------------------------------
    def _run(self) -> None:
        while True:
            try:
                self._serve()
                return  # stop() asked for it
            except BaseException:  # noqa: BLE001 - whatever killed the loop, the server must say so
                log.exception("engine loop stopped")
                self.alive = False
                with self._lock:  # their streams are failed below: computing them would be for nobody
                    self._inbox.clear()
                    self._pending_adds = 0
                self._loop.call_soon_threadsafe(self._fail_all, EngineDeadError(
                    "the engine loop stopped while this request was running; see the server log"))
            if not self.restart_on_failure or self._stop.is_set():
                return
            try:
                log.warning("restarting the engine (--restart-on-failure)")
                config, self.engine = self.engine.config, None  # the old model and KV pool go before the new load
                frozen_heap.thaw()
                self.engine = load_engine(config)
                frozen_heap.freeze()
            except Exception:  # noqa: BLE001
                log.exception("the engine could not be restarted; the server stays unavailable")
                return
            self.restarts += 1
            self._publish()
            self.alive = True

    def _serve(self) -> None:
        failures = 0
        while not self._stop.is_set():
            self.heap_trimmer.maybe_trim()
            self._drain_inbox()
            if not self.engine.has_unfinished_requests():
                self.engine.check_health()
                # what changes while no step runs (the disk tier's writer finishing blocks queued by the last step)
                # reaches /ledger and /metrics too: they read the last snapshot published
                self._publish()
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            try:
                outputs = self.engine.step()
                failures = 0
            except Exception as exc:  # noqa: BLE001 - one bad step must not take the server down
                failures += 1
                log.exception("engine step failed (%d in a row); failing the requests in flight", failures)
                if failures >= MAX_CONSECUTIVE_STEP_FAILURES or isinstance(exc, EngineDeadError):
                    raise
                self._fail_in_flight(exc)
                continue
            self._publish()
            if outputs:
                self._loop.call_soon_threadsafe(self._deliver, outputs)

    def _drain_inbox(self) -> None:
        with self._lock:
            commands = list(self._inbox)
            self._inbox.clear()
        for cmd in commands:
            if isinstance(cmd, AbortRequests):
                for rid in cmd.request_ids:
                    self.engine.abort_request(rid)
            else:
                self._add(cmd)
        if commands:
            # the added requests leave _pending_adds as the snapshot that holds them arrives, under one lock: a
            # submit in between would count them nowhere and admit past --max-queue
            self._publish(added=sum(cmd.num_seqs for cmd in commands if isinstance(cmd, AddRequests)))

    def _add(self, cmd: AddRequests) -> None:
        added: list[str] = []
        error: BaseException | None = None
        try:
            for i, (rid, prompt, params) in enumerate(cmd.items):
                self.engine.add_request(rid, prompt, params, arrival_time=cmd.arrival_time,
                                        grammar=cmd.grammars[i] if cmd.grammars else None, priority=cmd.priority,
                                        lora_request=cmd.lora_request)
                added.append(rid)
        except Exception as exc:  # noqa: BLE001 - a bad request is its own client's problem
            error = exc if isinstance(exc, TallyError) else _internal(exc)
            for rid in added:
                self.engine.abort_request(rid)
        self._loop.call_soon_threadsafe(self._accept, cmd.stream, error)

    def _fail_in_flight(self, exc: Exception) -> None:
        ids = list(self.engine.groups)
        for rid in ids:
            self.engine.abort_request(rid)
        try:
            self.engine.step()  # flushes the aborts so their blocks come back
        except Exception:  # noqa: BLE001
            log.exception("engine could not flush aborted requests")
        self._loop.call_soon_threadsafe(self._fail, ids, _internal(exc))

    def _publish(self, added: int = 0) -> None:
        """A new snapshot; `added`: engine requests just moved from the inbox into the engine, which it now counts."""
        snap = self.engine.snapshot()
        with self._lock:
            self.snapshot = snap
            self._pending_adds -= added
            self._queue_delay.observe(snap.num_started)
        if self._stats_log is not None:
            self._stats_log.maybe_log(snap)


def _internal(exc: BaseException) -> TallyError:
    err = TallyError(f"internal engine error: {type(exc).__name__}: {exc}")
    err.__cause__ = exc
    return err
