"""Where this process runs: its threads and CPUs, and the values every rank of a parallel engine must agree on."""
from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TypeVar

import torch
import torch.distributed as dist

from tally.engine.config import EngineConfig
from tally.engine.parallel.distributed import ParallelContext, allowed_cpus, rank_cpus
from tally.platform import parse_cpu_list, physical_cores, pin_process

log = logging.getLogger("tally.engine")
T = TypeVar("T")


def place_threads(config: EngineConfig, parallel: ParallelContext | None) -> None:
    """Threads = physical cores of the CPUs this process runs on. Ranks sharing a machine each get a disjoint
    share of its CPUs (tally/engine/parallel/distributed.py:rank_cpus); a single process is pinned only when asked."""
    if parallel is None:
        if config.cpu_affinity is not None:
            pin_process(parse_cpu_list(config.cpu_affinity))
        torch.set_num_threads(config.threads or physical_cores())
        return
    allowed = allowed_cpus(config)
    cpus = rank_cpus(parallel.env, allowed)
    parallel.saved_placement = (os.sched_getaffinity(0), torch.get_num_threads())
    pin_process(cpus)
    torch.set_num_threads(config.threads or physical_cores())
    advice = ""
    if parallel.env.local_world_size > len(allowed):
        advice = (f"; {parallel.env.local_world_size} ranks share {len(allowed)} CPU(s) here and will wait on each "
                  "other: run at most one rank per core")
    log.info("rank %d of %d: %d thread(s) on CPUs %s%s", parallel.env.rank, parallel.env.world_size,
             torch.get_num_threads(), ",".join(map(str, sorted(cpus))), advice)


def agreed(parallel: ParallelContext | None, decide: Callable[[], T]) -> T:
    """decide() on rank 0, the same value on every rank (a path measured on one CPU set, one KV pool size)."""
    if parallel is None:
        return decide()
    box = [decide() if parallel.env.rank == 0 else None]
    dist.broadcast_object_list(box, src=0, group=parallel.control)
    return box[0]
