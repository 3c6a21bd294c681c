"""--scheduling-policy priority (vLLM's): the queue is admitted by (priority, arrival), lower first; under memory
pressure the lowest-priority running request is preempted first, where first-come-first-served preempts the newest;
a request's greedy tokens do not depend on its priority or on being preempted; an fcfs engine refuses a priority."""
from __future__ import annotations

import pytest

from tally.core.kv_manager import KVCacheManager
from tally.core.request import Request
from tally.core.scheduler import Scheduler, SchedulerConfig
from tally.engine.llm import LLM
from tally.errors import InvalidRequestError
from tally.sampling_params import SamplingParams

# Three requests of 4 prompt tokens and 14 new ones need 15 blocks of 4; the pool has 12, so one is preempted.
SMALL_POOL = dict(dtype="float32", block_size=4, num_gpu_blocks_override=12, max_model_len=32, max_num_seqs=3)
GREEDY = SamplingParams(max_tokens=14, ignore_eos=True, temperature=0)
PROMPT = "The quick brown fox"


def test_the_queue_is_admitted_by_priority_then_arrival():
    s = Scheduler(SchedulerConfig(max_num_seqs=1, scheduling_policy="priority"), KVCacheManager(64, 4, False))
    for rid, priority, arrival in (("late-low", 2, 0.0), ("urgent", 0, 1.0), ("mid", 1, 2.0), ("urgent-2", 0, 3.0)):
        s.add(Request(rid, [1, 2], 4, arrival, priority=priority))
    assert [r.request_id for r in s.waiting] == ["urgent", "urgent-2", "mid", "late-low"]


def _run(llm: LLM, priorities: dict[str, int]) -> dict[str, Request]:
    """Each request added with its priority and run to the end; the engine's Request of each, by id."""
    for rid, priority in priorities.items():
        llm.engine.add_request(rid, PROMPT, GREEDY, priority=priority)
    reqs = {r.request_id: r for r in llm.engine.scheduler.waiting}
    outputs = llm.engine.run_until_done()
    for rid, r in reqs.items():
        assert list(outputs[rid].outputs[0].token_ids) == r.output_token_ids
    return reqs


@pytest.fixture(scope="module")
def alone(tiny_llama) -> list[int]:
    """The prompt's greedy tokens with nothing else running, first come first served."""
    return LLM(str(tiny_llama), dtype="float32").generate(PROMPT, GREEDY)[0].outputs[0].token_ids


def test_the_lowest_priority_is_preempted_first_and_answers_the_same(tiny_llama, alone):
    by_priority = LLM(str(tiny_llama), scheduling_policy="priority", **SMALL_POOL)
    reqs = _run(by_priority, {"a": 0, "b": 2, "c": 1})
    assert {rid: r.num_preemptions for rid, r in reqs.items()} == {"a": 0, "b": 1, "c": 0}
    assert all(r.output_token_ids == list(alone) for r in reqs.values())

    fcfs = LLM(str(tiny_llama), **SMALL_POOL)
    reqs = _run(fcfs, {"a": 0, "b": 0, "c": 0})
    assert {rid: r.num_preemptions for rid, r in reqs.items()} == {"a": 0, "b": 0, "c": 1}  # the newest
    with pytest.raises(InvalidRequestError, match="--scheduling-policy priority") as refused:
        fcfs.engine.add_request("d", PROMPT, GREEDY, priority=1)
    assert refused.value.param == "priority"


def test_one_slot_serves_requests_by_priority_then_arrival(tiny_llama, alone):
    llm = LLM(str(tiny_llama), scheduling_policy="priority", dtype="float32", max_num_seqs=1)
    reqs = _run(llm, {"first-low": 3, "second-high": 0, "third-mid": 1, "fourth-high": 0})
    assert sorted(reqs, key=lambda rid: reqs[rid].first_scheduled_time) == [
        "second-high", "fourth-high", "third-mid", "first-low"]
    assert all(r.output_token_ids == list(alone) for r in reqs.values())
    outputs = llm.generate([PROMPT] * 2, GREEDY, priority=[1, 0])  # LLM.generate takes one per prompt, as vLLM's
    assert [list(o.outputs[0].token_ids) for o in outputs] == [list(alone)] * 2
