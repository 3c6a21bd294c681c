"""One rule, one token budget per step: each running request's computed tokens catch up to its
known tokens (prompt + output). Prefill chunks and decode tokens share the step; the queue is
admitted first-come-first-served while the KV pool has room; when it runs out, the newest running
request is preempted by recompute."""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from tally.core.kv_manager import KVCacheManager
from tally.core.request import Request, RequestStatus


@dataclass(frozen=True)
class SchedulerConfig:
    """Defaults here are EngineConfig's too (tally/engine/config.py reads them)."""

    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    max_num_partial_prefills: int = 1  # requests whose prefill is split across steps, at once
    enable_chunked_prefill: bool = True


@dataclass
class ScheduledRequest:
    request: Request
    num_new_tokens: int


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)  # running requests first, then admitted ones
    preempted: list[Request] = field(default_factory=list)


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager) -> None:
        self.config = config
        self.kv = kv
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def schedule(self) -> SchedulerOutput:
        cfg, out = self.config, SchedulerOutput()
        budget = cfg.max_num_batched_tokens
        partial = 0
        self._begin_step()
        for req in list(self.running):
            if req.status is RequestStatus.PREEMPTED or not self._may_run(req):  # preempted earlier in this loop
                continue
            n = self._num_new_tokens(req.num_tokens - req.num_computed_tokens, budget, partial)
            if n == 0:
                continue
            while not self.kv.allocate(req, n):
                victim = self.running[-1]
                budget += self._preempt(victim, out)
                if victim is req:
                    break
            else:
                partial += req.num_computed_tokens + n < req.num_tokens
                budget -= n
                out.scheduled.append(ScheduledRequest(req, n))
        if not out.preempted and self._may_admit():
            self._admit(out, budget, partial)
        self._end_step()
        return out

    # Hooks for batching policies other than continuous batching (tally/core/static_scheduler.py).
    def _begin_step(self) -> None:
        pass

    def _may_run(self, req: Request) -> bool:
        return True

    def _may_admit(self) -> bool:
        return True

    def _end_step(self) -> None:
        pass

    def _num_new_tokens(self, n: int, budget: int, partial: int) -> int:
        """How many of a request's n uncomputed tokens run this step."""
        if n <= budget:
            return n
        if not self.config.enable_chunked_prefill:
            return 0 if budget < self.config.max_num_batched_tokens or n <= budget else n
        return 0 if partial >= self.config.max_num_partial_prefills else budget

    def _admit(self, out: SchedulerOutput, budget: int, partial: int) -> None:
        now = time.monotonic()
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            if req.parent is not None and not (req.parent.prefill_done or req.parent.status.finished):
                break  # an n>1 sibling waits to share its parent's prompt blocks
            cached = self.kv.find_cached_prefix(req)
            num_cached = len(cached) * self.kv.block_size
            remaining = req.num_tokens - req.num_computed_tokens - num_cached
            n = self._num_new_tokens(remaining, budget, partial)
            if n == 0 or not self.kv.allocate(req, n, cached):
                break
            self.waiting.popleft()
            if req.num_cached_tokens < 0:  # first admission: preemption recomputes are not hits
                req.num_cached_tokens = num_cached
                req.first_scheduled_time = now
                self.kv.record_first_admission(req, num_cached)
            req.num_computed_tokens += num_cached
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            partial += n < remaining
            budget -= n
            out.scheduled.append(ScheduledRequest(req, n))

    def _preempt(self, req: Request, out: SchedulerOutput) -> int:
        """Free req's blocks and requeue it at the front; returns the budget it had taken."""
        self.running.remove(req)
        self.kv.free(req)
        req.num_computed_tokens = 0
        req.status = RequestStatus.PREEMPTED
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)
        out.preempted.append(req)
        taken = sum(s.num_new_tokens for s in out.scheduled if s.request is req)
        out.scheduled = [s for s in out.scheduled if s.request is not req]
        return taken

    def finish_step(self, out: SchedulerOutput) -> None:
        """The forward pass ran: the scheduled tokens are computed now."""
        for s in out.scheduled:
            s.request.num_computed_tokens += s.num_new_tokens
            self.kv.cache_computed_blocks(s.request)
            self.kv.release_out_of_window(s.request)

    def finish(self, req: Request, status: RequestStatus) -> None:
        """Stop a request (done, or aborted) and give its blocks back."""
        if req.status.finished:
            return
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        req.status = status
        self.kv.free(req)
