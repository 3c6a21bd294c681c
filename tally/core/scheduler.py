"""One rule, one token budget per step: each running request's computed tokens catch up to its known tokens
(prompt + output, and any speculative proposals after them). Prefill chunks and decode tokens share the step;
requests that fit whole go before chunks of long prompts, so a short prompt never waits behind a long one; the
queue is otherwise admitted first-come-first-served (or by priority, then arrival) while the KV pool has room; when it
runs out, the newest running request (or the lowest in priority) is preempted (proposals are dropped first: nobody is
preempted for a bet): its blocks go to the swap space where that is measured cheaper than recomputing them
(tally/core/kv_tiers.py), else it recomputes: its prompt in one step, its generated tokens from the next
(tokens_to_compute), so each position runs as it first did."""
from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from tally.core.kv_manager import KVCacheManager
from tally.core.kv_tiers import SwapTier
from tally.core.request import Request, RequestStatus
from tally.flags import MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS

SCHEDULING_POLICIES = ("fcfs", "priority")  # vLLM's --scheduling-policy


@dataclass(frozen=True)
class SchedulerConfig:
    """Defaults here are EngineConfig's too (tally/engine/config.py reads them); the flags' own are every verb's."""

    max_num_seqs: int = MAX_NUM_SEQS.default
    max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS.default
    max_num_partial_prefills: int = 1  # requests whose prefill is split across steps, at once
    enable_chunked_prefill: bool = True
    scheduling_policy: str = "fcfs"  # one of SCHEDULING_POLICIES
    max_loras: int = 1  # different LoRA adapters among the running requests


@dataclass
class ScheduledRequest:
    request: Request
    num_new_tokens: int


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)  # running requests first, then admitted ones
    preempted: list[Request] = field(default_factory=list)


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager, swap: SwapTier | None = None,
                 copy_block: Callable[[int, int], None] | None = None) -> None:
        """`copy_block(src, dst)`: the pool's KV of one block copied over another's (None: siblings recompute)."""
        self.config = config
        self.kv = kv
        self.swap = swap
        self.copy_block = copy_block
        self.by_priority = config.scheduling_policy == "priority"
        self.waiting: deque[Request] = deque()  # in the order admission tries them
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.num_started = 0  # requests admitted for the first time (preemption recomputes not counted)
        # requests whose scheduled prompt tokens are still being computed over several steps (a held prompt pass,
        # tally/engine/prompt_pass.py): not scheduled again until it ends
        self.held: set[str] = set()

    def add(self, req: Request) -> None:
        if self.by_priority:
            self._queue(req)
        else:
            self.waiting.append(req)

    def _queue(self, req: Request) -> None:
        """Into the waiting queue by (priority, arrival), after the requests it ties with."""
        self.waiting.insert(bisect.bisect_right(self.waiting, _rank(req), key=_rank), req)

    def schedule(self, token_budget: int | None = None, chunks: bool = True) -> SchedulerOutput:
        """`token_budget` lowers this step's budget below max_num_batched_tokens (the engine's latency target);
        without `chunks`, only requests whose tokens fit whole run (the engine's prompt pass is running).

        Order within the budget: running requests whose tokens fit whole (decodes, last chunks), then waiting
        requests that fit whole (short prompts never queue behind a long one), then chunks of long prompts
        (running first, then new ones up to max_num_partial_prefills); one block of budget is kept for a
        running chunked prompt, so it still moves while short prompts keep arriving."""
        cfg, out = self.config, SchedulerOutput()
        budget = cfg.max_num_batched_tokens if token_budget is None else min(token_budget, cfg.max_num_batched_tokens)
        self._begin_step()
        chunked: list[Request] = []
        budget, partial = self._schedule_running(list(self.running), budget, 0, out, chunked)
        admit = not out.preempted and self._may_admit()
        if admit:
            reserve = min(self.kv.block_size, budget) if chunked else 0
            budget, partial = self._admit(out, budget - reserve, partial, whole_only=True)
            budget += reserve
        if chunks:
            budget, partial = self._schedule_running(chunked, budget, partial, out, None)
            if admit and not out.preempted:
                self._admit(out, budget, partial, whole_only=False)
        self._end_step()
        return out

    def _schedule_running(self, reqs: list[Request], budget: int, partial: int, out: SchedulerOutput,
                          chunked: list[Request] | None) -> tuple[int, int]:
        """Schedule running requests; with `chunked` given, those whose tokens do not fit whole go there."""
        for req in reqs:
            if req.status is RequestStatus.PREEMPTED or req.request_id in self.held or not self._may_run(req):
                continue  # preempted earlier this step, or its prompt's pass still runs
            if req.spec_token_ids and req.num_tokens_with_spec - req.num_computed_tokens > budget:
                # Proposals are a bet, not owed work: the ones that do not fit are dropped, never chunked.
                del req.spec_token_ids[max(0, budget - (req.num_tokens - req.num_computed_tokens)):]
            uncomputed = tokens_to_compute(req, req.num_computed_tokens)
            if chunked is not None and uncomputed > budget:
                chunked.append(req)
                continue
            n = self._num_new_tokens(uncomputed, budget, partial)
            if n == 0:
                continue
            while not self.kv.allocate(req, n):
                if req.spec_token_ids:  # nobody is preempted for a bet
                    n -= len(req.spec_token_ids)
                    req.spec_token_ids.clear()
                    continue
                victim = max(self.running, key=_rank) if self.by_priority else self.running[-1]
                budget += self._preempt(victim, out)
                if victim is req:
                    break
            else:
                partial += req.num_computed_tokens + n < req.num_tokens
                budget -= n
                out.scheduled.append(ScheduledRequest(req, n))
        return budget, partial

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

    def _admit(self, out: SchedulerOutput, budget: int, partial: int, whole_only: bool) -> tuple[int, int]:
        """First come, first served, except that a request that cannot start now (a prompt that does not fit
        whole when `whole_only`, or while the chunking slots are taken; an n>1 sibling before its parent's
        prefill) keeps its place and lets the ones behind it start. Running out of KV blocks stops admission:
        nobody overtakes for memory."""
        now = time.monotonic()
        i = 0
        while i < len(self.waiting) and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[i]
            if req.parent is not None and not (req.parent.prefill_done or req.parent.status.finished):
                i += 1  # an n>1 sibling waits to share its parent's prompt blocks
                continue
            if self._adapters_full(req):
                i += 1
                continue
            swapped = self.swap.swapped_tokens(req.request_id) if self.swap is not None else 0
            cached = [] if swapped else self.kv.find_cached_prefix(req)
            num_cached = len(cached) * self.kv.block_size
            forked = 0 if swapped else self._forkable_tokens(req, len(cached))
            start = req.num_computed_tokens + num_cached + swapped + forked
            remaining = tokens_to_compute(req, start)
            n = 0 if whole_only and remaining > budget else self._num_new_tokens(remaining, budget, partial)
            if n == 0:
                i += 1
                continue
            # A recompute that starts whole takes the room of its generated tokens too, which run next step: room for
            # its prompt alone would see it preempted again there, its prompt computed for nothing
            room = req.num_tokens - start if n == remaining else n
            req.num_computed_tokens += swapped + forked  # computed again once copied in, before the step runs
            if not self.kv.allocate(req, room, cached):
                req.num_computed_tokens -= swapped + forked
                break
            if swapped:
                self.swap.swap_in(req.request_id, self.kv.block_table(req.request_id))
            if forked:
                self.copy_block(self.kv.held_block(req.parent.request_id, len(cached)),
                                self.kv.held_block(req.request_id, len(cached)))
            del self.waiting[i]
            if req.num_cached_tokens < 0:  # first admission: preemption recomputes are not hits
                req.num_cached_tokens = num_cached
                req.first_scheduled_time = now
                self.num_started += 1
                self.kv.record_first_admission(req, num_cached)
            req.num_computed_tokens += num_cached
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            partial += n < remaining
            budget -= n
            out.scheduled.append(ScheduledRequest(req, n))
        return budget, partial

    def _adapters_full(self, req: Request) -> bool:
        """vLLM's rule: a request whose LoRA adapter is not running waits while max_loras others are."""
        if req.lora_key is None:
            return False
        running = {r.lora_key for r in self.running if r.lora_key is not None}
        return req.lora_key not in running and len(running) >= self.config.max_loras

    def _forkable_tokens(self, req: Request, num_cached_blocks: int) -> int:
        """Tokens of the prompt's last, partial block that an n>1 sibling copies from its running parent instead of
        computing them again (every sibling would otherwise prefill up to a block of the same prompt): all that the
        parent computed but the last prompt token, whose logits the sibling needs."""
        parent, start = req.parent, num_cached_blocks * self.kv.block_size
        if (self.copy_block is None or parent is None or parent.status is not RequestStatus.RUNNING
                or req.num_computed_tokens or req.num_output_tokens or req.skip_prefix_cache
                or num_cached_blocks != (req.num_tokens - 1) // self.kv.block_size
                or self.kv.held_block(parent.request_id, num_cached_blocks) is None):
            return 0
        return max(0, min(parent.num_computed_tokens, req.num_tokens - 1) - start)

    def _preempt(self, req: Request, out: SchedulerOutput) -> int:
        """Free req's blocks (copied to the swap space first, where that measured cheaper than recomputing them) and
        requeue it at the front; returns the budget it had taken."""
        self.running.remove(req)
        if self.swap is not None:
            self.swap.swap_out(req, self.kv.swappable_blocks(req))
        self.kv.free(req)
        req.spec_token_ids.clear()
        req.num_computed_tokens = 0
        req.status = RequestStatus.PREEMPTED
        req.num_preemptions += 1
        self.num_preemptions += 1
        if self.by_priority:
            self._queue(req)
        else:
            self.waiting.appendleft(req)
        out.preempted.append(req)
        taken = sum(s.num_new_tokens for s in out.scheduled if s.request is req)
        out.scheduled = [s for s in out.scheduled if s.request is not req]
        return taken

    def finish_step(self, out: SchedulerOutput) -> None:
        """The forward pass ran: the scheduled tokens are computed now (the engine first lowers a speculating
        request's count to the proposals it verified; the rejected ones' slots are written over later)."""
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
        if self.swap is not None:
            self.swap.discard(req.request_id)


def tokens_to_compute(req: Request, computed: int) -> int:
    """A request's tokens from `computed` on that it may compute in one step: up to its known tokens and proposals,
    but never across the end of its prompt. Only a request preempted by recompute has both left: its prompt runs as a
    prefill, and its generated tokens from the next step on as the decode rows that first made them
    (tally/engine/inputs.py), so its KV, and what it samples after, keep their bits."""
    end = req.num_tokens_with_spec
    if computed < req.num_prompt_tokens:
        end = min(end, req.num_prompt_tokens)
    return end - computed


def _rank(req: Request) -> tuple[int, float]:
    """The priority policy's order: lower priority first, then earlier arrival (vLLM's)."""
    return req.priority, req.arrival_time
