"""A rank other than 0 of a parallel engine: load this rank's slice, then run every step rank 0 sends until it says
stop. Started by rank 0 (`python -m tally.engine.parallel.follower`, tally/engine/parallel/distributed.py) or, under
torchrun, by `tally serve` on ranks 1..N-1."""
from __future__ import annotations

import json
import logging
import os
import sys

from tally.engine import frozen_heap
from tally.engine.config import EngineConfig
from tally.engine.model_step import receive_step
from tally.engine.parallel.distributed import CONFIG_ENV
from tally.engine.parallel.pipeline import forward_step
from tally.engine.startup.load import load_model

log = logging.getLogger("tally.engine")


def follow(config: EngineConfig) -> int:
    """The exit status: 0 when rank 0 said stop, 1 when it went away."""
    m = load_model(config)
    frozen_heap.freeze()  # a rank's collector pause would stall every rank
    ctx = m.parallel
    try:
        while (step := receive_step(ctx.control)) is not None:
            forward_step(m.model, m.kv_caches, step, ctx.pipe)
    except RuntimeError as exc:
        log.error("rank %d: lost rank 0 or a peer (%s); stopping", ctx.env.rank, exc)
        return 1
    ctx.close()
    return 0


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return follow(EngineConfig(**json.loads(os.environ[CONFIG_ENV])))


if __name__ == "__main__":
    sys.exit(main())
