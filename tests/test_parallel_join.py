"""A tensor-parallel start that fails while joining the group leaves no rank behind: rank 0 started the followers,
so rank 0 ends them (tally/engine/parallel/distributed.py:join)."""
from __future__ import annotations

import pytest

from tally.engine.config import EngineConfig
from tally.engine.parallel import distributed


def test_a_failed_join_ends_the_followers_it_started(monkeypatch):
    started = []

    def start(*args):
        started.append(real_start(*args))
        return started[-1]

    def refuse(*args, **kwargs):
        raise RuntimeError("the group could not form")

    real_start = distributed._start_follower
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(distributed, "_start_follower", start)
    monkeypatch.setattr(distributed.dist, "init_process_group", refuse)
    with pytest.raises(RuntimeError, match="could not form"):
        distributed.join(EngineConfig(tensor_parallel_size=2))
    assert len(started) == 1 and started[0].poll() is not None
