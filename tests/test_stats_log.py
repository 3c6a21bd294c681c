from __future__ import annotations

from tally.engine.snapshot import EngineSnapshot
from tally.engine.stats_log import StatsLog


def test_the_periodic_line_reports_rates_queues_and_the_kv_cache_like_vllm():
    now = [0.0]
    log = StatsLog(interval_s=10.0, clock=lambda: now[0])
    assert log.maybe_log(EngineSnapshot()) is None  # the first snapshot only starts the clock
    now[0] = 5.0
    assert log.maybe_log(EngineSnapshot(prompt_tokens=100)) is None  # too soon
    now[0] = 10.0
    line = log.maybe_log(EngineSnapshot(num_running=6, num_waiting=2, num_blocks=100, num_used_blocks=41,
                                        prompt_tokens=4123, generated_tokens=881, prefix_queried_tokens=80,
                                        prefix_hit_tokens=10))
    assert line == ("Avg prompt throughput: 412.3 tokens/s, Avg generation throughput: 88.1 tokens/s, "
                    "Running: 6 reqs, Waiting: 2 reqs, KV cache usage: 41.0%, Prefix cache hit rate: 12.5%")
