from __future__ import annotations

from tally.core.kv_manager import KVCacheManager
from tally.core.request import Request, RequestStatus
from tally.core.scheduler import Scheduler, SchedulerConfig
from tally.core.static_scheduler import StaticBatchScheduler


def _sched(num_blocks=64, block_size=4, scheduler_cls=Scheduler, **cfg) -> Scheduler:
    return scheduler_cls(SchedulerConfig(**cfg), KVCacheManager(num_blocks, block_size, enable_prefix_caching=False))


def _step(s: Scheduler, sample: bool = True):
    out = s.schedule()
    s.finish_step(out)
    if sample:  # every request that caught up to its known tokens gets one new token
        for sr in out.scheduled:
            r = sr.request
            if r.num_computed_tokens == r.num_tokens:
                r.append_token(7)
    return out


def test_one_token_budget_covers_prefill_chunks_and_decodes():
    s = _sched(max_num_batched_tokens=10, max_num_partial_prefills=1)
    a = Request("a", list(range(4)), 8, 0.0)
    b = Request("b", list(range(30)), 8, 0.0)
    s.add(a)
    s.add(b)
    out = _step(s)
    assert [(x.request.request_id, x.num_new_tokens) for x in out.scheduled] == [("a", 4), ("b", 6)]
    out = _step(s)
    # a decodes (1 token), b's prefill continues with the rest of the budget
    assert [(x.request.request_id, x.num_new_tokens) for x in out.scheduled] == [("a", 1), ("b", 9)]
    assert sum(x.num_new_tokens for x in out.scheduled) <= 10


def test_partial_prefill_cap_holds_back_a_second_long_prompt():
    s = _sched(max_num_batched_tokens=8, max_num_partial_prefills=1)
    s.add(Request("a", list(range(20)), 4, 0.0))
    s.add(Request("b", list(range(20)), 4, 0.0))
    out = _step(s)
    assert [x.request.request_id for x in out.scheduled] == ["a"]


def test_admission_is_first_come_first_served_and_respects_max_num_seqs():
    s = _sched(max_num_seqs=2)
    for rid in "abc":
        s.add(Request(rid, [1, 2], 4, 0.0))
    out = _step(s)
    assert [x.request.request_id for x in out.scheduled] == ["a", "b"]
    assert [r.request_id for r in s.waiting] == ["c"]


def test_newest_request_is_preempted_when_blocks_run_out_and_resumes_later():
    s = _sched(num_blocks=3, block_size=4, max_num_batched_tokens=64)
    a = Request("a", [1, 2, 3, 4], 8, 0.0)
    b = Request("b", [5, 6, 7], 8, 0.0)
    s.add(a)
    s.add(b)
    _step(s)  # a: 1 block (+1 once it grows), b: 1 block
    _step(s)  # a needs its second block now: 3 blocks in use
    out = _step(s)  # b needs a second block: none left, so b (the newest) is preempted
    assert out.preempted == [b] and b.status == RequestStatus.PREEMPTED
    assert b.num_computed_tokens == 0 and s.waiting[0] is b
    s.finish(a, RequestStatus.FINISHED_LENGTH)
    known = b.num_tokens
    assert b.num_output_tokens > 0
    # recompute: the prompt in one step, then the generated tokens (the decode rows that first made them)
    out = _step(s, sample=False)
    assert [(x.request, x.num_new_tokens) for x in out.scheduled] == [(b, b.num_prompt_tokens)]
    out = _step(s)
    assert [(x.request, x.num_new_tokens) for x in out.scheduled] == [(b, known - b.num_prompt_tokens)]


def test_a_request_preempted_by_recompute_comes_back_only_when_all_it_had_fits():
    """Its prompt runs first and its generated tokens a step later, but room for its prompt alone would see it
    preempted again at that step, its prompt computed for nothing."""
    s = _sched(num_blocks=3, block_size=4, max_num_batched_tokens=64)
    a = Request("a", [1, 2, 3, 4], 8, 0.0)
    b = Request("b", [5, 6, 7], 8, 0.0)
    s.add(a)
    s.add(b)
    _step(s)
    _step(s)
    assert _step(s).preempted == [b]  # a holds 2 blocks; b's 3 prompt and 2 generated tokens need 2, 1 is free
    assert [x.request for x in _step(s).scheduled] == [a]
    s.finish(a, RequestStatus.FINISHED_LENGTH)
    out = _step(s, sample=False)
    assert [(x.request, x.num_new_tokens) for x in out.scheduled] == [(b, 3)]
    assert s.kv.num_held_blocks("b") == 2  # its generated tokens' block is held already


def test_static_scheduling_waits_for_the_batch_and_admits_nobody_mid_flight():
    s = _sched(max_num_seqs=2, scheduler_cls=StaticBatchScheduler)
    s.add(Request("a", [1, 2], 3, 0.0))
    s.add(Request("b", [1, 2, 3], 3, 0.0))
    _step(s)
    s.add(Request("late", [1], 3, 0.0))
    out = _step(s)
    assert "late" not in [x.request.request_id for x in out.scheduled]


def test_a_long_prompt_waiting_for_the_chunking_slot_lets_short_ones_behind_it_start():
    s = _sched(max_num_batched_tokens=16, max_num_partial_prefills=1)
    s.add(Request("long-1", list(range(40)), 4, 0.0))
    _step(s)  # long-1 takes the one chunking slot
    s.add(Request("long-2", list(range(40)), 4, 0.0))
    s.add(Request("short", [1, 2, 3], 4, 0.0))
    out = _step(s)
    started = [x.request.request_id for x in out.scheduled]
    assert "short" in started and "long-2" not in started
    assert [r.request_id for r in s.waiting] == ["long-2"]  # it keeps its place at the head


def test_a_step_budget_below_the_configured_one_bounds_the_step():
    s = _sched(max_num_batched_tokens=64)
    s.add(Request("a", list(range(40)), 4, 0.0))
    out = s.schedule(token_budget=10)
    assert sum(x.num_new_tokens for x in out.scheduled) == 10


def test_held_requests_wait_and_a_step_without_chunks_runs_only_whole_prompts():
    """The engine's prompt pass: its requests are held out of the scheduler; while it runs, a long prompt waits to
    be the next pass rather than start chunking, and a short one behind it starts whole."""
    s = _sched(max_num_batched_tokens=64)
    s.add(Request("held", list(range(20)), 4, 0.0))
    s.schedule()  # admitted; its pass would run its 20 prompt tokens
    s.held = {"held"}
    s.add(Request("long", list(range(40)), 4, 0.0))
    s.add(Request("short", [1, 2, 3], 4, 0.0))
    out = s.schedule(token_budget=10, chunks=False)
    assert [(x.request.request_id, x.num_new_tokens) for x in out.scheduled] == [("short", 3)]
    assert [r.request_id for r in s.waiting] == ["long"]
