"""The --max-itl planner over a real scheduler and a step cost fitted to known steps: every decoding stream gets a row
in every step, a step's prompt tokens stay within the latency target, and a prompt's prefill is spread in even chunks
over PREFILL_SPREAD_STEPS steps unless the target allows less."""
from __future__ import annotations

import math

from tally.core.kv_manager import KVCacheManager
from tally.core.request import Request
from tally.core.scheduler import Scheduler, SchedulerConfig
from tally.engine.step_cost import StepCost
from tally.engine.step_plan import PLANNED_SHARE_OF_ITL, PREFILL_SPREAD_STEPS, token_budget
from tally.engine.step_stats import mean_context, prompt_chunks

BLOCK = 16
MAX_ITL_S = 0.3


def _step_s(chunks: list[tuple[int, int]]) -> float:
    """40 ms for the decodes and a mixed step's overhead, 1 ms per prompt token, 1 µs per token of context each
    attends."""
    return 0.040 + sum(0.001 * n + 1e-6 * n * (start + n / 2) for n, start in chunks)


def _fitted_cost() -> StepCost:
    cost = StepCost()
    for n, start in ((64, 0), (32, 500), (80, 1000), (48, 200), (96, 1500), (24, 2500)):
        cost.observe(n, start + n / 2, _step_s([(n, start)]))
    return cost


def _decoding(s: Scheduler, n: int) -> list[Request]:
    streams = [Request(f"d{i}", [1, 2, 3], 10_000, 0.0) for i in range(n)]
    for r in streams:
        s.add(r)
    out = s.schedule()
    s.finish_step(out)
    for r in streams:
        r.append_token(7)
    return streams


def _run(s: Scheduler, cost: StepCost, streams: list[Request], steps: int,
         learn: bool = True) -> list[list[tuple[int, int]]]:
    """Plans and runs `steps` steps (the cost fitted to each, with `learn`); checks every stream decodes in each;
    returns each step's prompt chunks."""
    all_chunks = []
    for _ in range(steps):
        out = s.schedule(token_budget(s.running, s.waiting, cost, MAX_ITL_S, BLOCK))
        assert {x.request.request_id for x in out.scheduled if x.num_new_tokens == 1} >= {r.request_id
                                                                                         for r in streams}
        assert not out.preempted
        chunks = prompt_chunks(out)
        all_chunks.append(chunks)
        s.finish_step(out)
        if chunks and learn:
            cost.observe(sum(n for n, _ in chunks), mean_context(chunks), _step_s(chunks))
        for x in out.scheduled:
            if x.request.num_computed_tokens == x.request.num_tokens:
                x.request.append_token(7)
    return all_chunks


def test_every_stream_decodes_in_every_step_and_chunks_stay_within_the_target():
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=2048),
                  KVCacheManager(2048, BLOCK, enable_prefix_caching=False))
    streams = _decoding(s, 4)
    for i, n in enumerate((40, 300, 1200, 90, 2500)):
        s.add(Request(f"p{i}", list(range(n)), 4, 0.0))
    steps = _run(s, _fitted_cost(), streams, 400)
    assert not s.waiting and all(r.num_output_tokens for r in s.running)  # every prompt was prefilled
    for chunks in steps:
        tokens = sum(n for n, _ in chunks)
        assert tokens <= BLOCK or _step_s(chunks) <= MAX_ITL_S * PLANNED_SHARE_OF_ITL


def test_a_prompt_beside_decodes_is_spread_in_even_chunks():
    s = Scheduler(SchedulerConfig(), KVCacheManager(512, BLOCK, enable_prefix_caching=False))
    streams = _decoding(s, 2)
    s.add(Request("p", list(range(320)), 4, 0.0))
    sizes = [sum(n for n, _ in chunks) for chunks in _run(s, _fitted_cost(), streams, 40) if chunks]
    even = math.ceil(320 / PREFILL_SPREAD_STEPS)
    assert sizes == [even] * (320 // even)  # the target (0.225 s) would have allowed ~170 tokens a step


def test_a_prompt_too_long_to_spread_within_the_target_goes_at_the_targets_pace():
    s = Scheduler(SchedulerConfig(), KVCacheManager(1024, BLOCK, enable_prefix_caching=False))
    streams = _decoding(s, 2)
    s.add(Request("p", list(range(12_000)), 4, 0.0))
    cost = _fitted_cost()
    target_s = MAX_ITL_S * PLANNED_SHARE_OF_ITL
    for (size, start), in _run(s, cost, streams, 10, learn=False):
        assert size == cost.prompt_tokens_within(target_s, start) < 12_000 / PREFILL_SPREAD_STEPS
