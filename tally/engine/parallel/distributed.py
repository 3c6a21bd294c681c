"""The processes of a parallel engine (tensor and pipeline), on torch.distributed (gloo on CPU)."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field, replace
from datetime import timedelta

import torch
import torch.distributed as dist

from tally.engine.config import EngineConfig
from tally.engine.parallel.pipeline import PipelinePeers
from tally.layers.parallel import TPGroup
from tally.platform import parse_cpu_list, pin_process

log = logging.getLogger("tally.engine")
CONFIG_ENV = "TALLY_ENGINE_CONFIG"  # the engine config, as JSON, of a rank started here
STORE_ENV = "TALLY_TP_STORE"  # host:port of rank 0's rendezvous store, for a rank started here
# A rank gone mid-step is seen at once (its sockets close); the timeout bounds a rank that hangs instead.
STEP_TIMEOUT = timedelta(minutes=5)
# The other ranks wait for rank 0's next step for as long as the server is idle.
IDLE_TIMEOUT = timedelta(days=365)


@dataclass(frozen=True)
class RankEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int

    @classmethod
    def from_environ(cls) -> RankEnv | None:
        """This process's place when torchrun (or rank 0 here) started it; None for a process started by hand."""
        if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
            return None
        world = int(os.environ["WORLD_SIZE"])
        return cls(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", os.environ["RANK"])),
                   int(os.environ.get("LOCAL_WORLD_SIZE", world)))


@dataclass
class ParallelContext:
    env: RankEnv
    tp: TPGroup | None  # None: one rank per pipeline stage
    pipe: PipelinePeers | None  # None: no pipeline (one stage)
    control: dist.ProcessGroup  # rank 0's step broadcast (tally/engine/model_step.py)
    followers: list[subprocess.Popen] = field(default_factory=list)  # ranks this process started
    # rank 0 may be the user's own process (LLM(...)): its CPUs and threads before this rank was placed
    saved_placement: tuple[set[int], int] | None = None

    def close(self, timeout_s: float = 30.0) -> None:
        for proc in self.followers:
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
        if dist.is_initialized():
            dist.destroy_process_group()
        if self.saved_placement is not None:
            cpus, threads = self.saved_placement
            pin_process(cpus)
            torch.set_num_threads(threads)

    def abort(self) -> None:
        """After a failed start: the ranks this process started are killed, the group is left."""
        for proc in self.followers:
            proc.kill()
        self.close()


def is_follower(config: EngineConfig) -> bool:
    """Whether this process is a rank other than 0 of a torchrun job of this split: it follows rank 0 instead of
    serving. RANK set for some other reason (a training job's pod, say) does not count without a split to join."""
    env = RankEnv.from_environ()
    return config.world_size > 1 and env is not None and env.rank != 0


def join(config: EngineConfig) -> ParallelContext:
    """Two ways in, one code path after: under `torchrun` every rank runs the same `tally serve` command and reads its
    rank from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT); without
    it, N = tensor_parallel_size x pipeline_parallel_size on one machine makes this process rank 0, and it starts ranks
    1..N-1 as `python -m tally.engine.parallel.follower` with the same variables set (as vLLM's multiprocessing executor
    starts its workers). Rank 0 serves; the others follow its steps (tally/engine/parallel/follower.py).

    CPU placement: the ranks on one machine split the CPUs this process may use into equal, disjoint sets, each rank
    pinned to its own, with one thread per physical core in it: two ranks' OpenMP pools on the same cores would
    take turns instead of working.

    Join (or, as rank 0 outside torchrun, start) the tensor_parallel_size x pipeline_parallel_size ranks."""
    env = RankEnv.from_environ()
    world = config.world_size
    followers: list[subprocess.Popen] = []
    if env is None:  # rank 0 here: it holds the rendezvous store and starts the others
        env = RankEnv(0, world, 0, world)
        store = dist.TCPStore("127.0.0.1", 0, env.world_size, is_master=True, timeout=STEP_TIMEOUT,
                              wait_for_workers=False)
        followers = [_start_follower(config, rank, env.world_size, store.port) for rank in range(1, env.world_size)]
    elif STORE_ENV in os.environ:  # a rank started by rank 0 here
        host, port = os.environ[STORE_ENV].rsplit(":", 1)
        store = dist.TCPStore(host, int(port), env.world_size, is_master=False, timeout=STEP_TIMEOUT)
    else:  # torchrun's: its rendezvous
        store = None
        if env.world_size != world:
            raise ValueError(f"torchrun started {env.world_size} processes but tensor_parallel_size x "
                             f"pipeline_parallel_size is {world}; they must be equal")
    try:
        dist.init_process_group("gloo", init_method=None if store else "env://", store=store, rank=env.rank,
                                world_size=env.world_size, timeout=STEP_TIMEOUT)
        tp = _tp_group(env.rank, config.tensor_parallel_size, config.pipeline_parallel_size,
                       not config.batch_invariant)
        control = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
        pipe = _pipeline_peers(env.rank, config.tensor_parallel_size, config.pipeline_parallel_size)
    except BaseException:
        # no context reaches the caller to abort(): the ranks started here must not outlive the failed join
        for proc in followers:
            proc.kill()
            proc.wait()
        if dist.is_initialized():
            dist.destroy_process_group()
        raise
    return ParallelContext(env, tp, pipe, control, followers)


def _tp_group(rank: int, tp: int, pp: int, partial_sums: bool) -> TPGroup | None:
    """This rank's TP group: the ranks of its pipeline stage. new_group is collective over the whole world, so
    every rank makes every stage's group, in the same order."""
    if tp == 1:
        return None
    if pp == 1:
        return TPGroup(rank, tp, partial_sums=partial_sums)  # the default group: the whole world
    groups = [dist.new_group(list(range(s * tp, (s + 1) * tp)), backend="gloo", timeout=STEP_TIMEOUT)
              for s in range(pp)]
    return TPGroup(rank % tp, tp, groups[rank // tp], partial_sums=partial_sums)


def _pipeline_peers(rank: int, tp: int, pp: int) -> PipelinePeers | None:
    """This rank's place in the pipeline, with its two-rank groups (tally/engine/parallel/pipeline.py). new_group is
    collective over the whole world, so every rank makes every group, in the same order."""
    if pp == 1:
        return None
    peers = PipelinePeers(rank, tp, pp)
    pairs = [(s * tp + t, (s + 1) * tp + t) for s in range(pp - 1) for t in range(tp)]
    groups = {pair: dist.new_group(list(pair), backend="gloo", timeout=STEP_TIMEOUT) for pair in pairs}
    logits = dist.new_group([0, peers.logits_rank], backend="gloo", timeout=STEP_TIMEOUT)
    return replace(peers, from_prev=groups.get((peers.prev_rank, rank)), to_next=groups.get((rank, peers.next_rank)),
                   logits=logits if rank in (0, peers.logits_rank) else None)


def rank_cpus(env: RankEnv, allowed: set[int]) -> set[int]:
    """This rank's share of `allowed` (the CPUs the job may use on this machine): disjoint between the ranks of
    one machine, all of them when there are more ranks than CPUs."""
    cpus = sorted(allowed)
    if env.local_world_size > len(cpus):
        return set(cpus)
    per = len(cpus) // env.local_world_size
    return set(cpus[env.local_rank * per:(env.local_rank + 1) * per])


def allowed_cpus(config: EngineConfig) -> set[int]:
    if config.cpu_affinity is not None:
        return parse_cpu_list(config.cpu_affinity)
    return os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))


def _start_follower(config: EngineConfig, rank: int, world_size: int, port: int) -> subprocess.Popen:
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
               LOCAL_WORLD_SIZE=str(world_size))
    env[STORE_ENV] = f"127.0.0.1:{port}"
    env[CONFIG_ENV] = json.dumps(asdict(config))
    return subprocess.Popen([sys.executable, "-m", "tally.engine.parallel.follower"], env=env)
