"""`--link gloo`: measure what one collective costs between two processes on this machine, as Tally's CPU ranks
talk (torch.distributed's gloo over loopback, each rank pinned to its own CPU).

Latency is the mean all-reduce of a small tensor (a hidden state's size) as a model meets it: each one after a
burst of work on both ranks and waited for as the engine waits (tally/layers/spin_wait.py): after work one rank
arrives first, and what it pays to notice the other, which a back-to-back loop never sees, is part of every
collective of a step. Bandwidth comes from a 4 MiB all-reduce's extra time over
the small one, back to back (a ring all-reduce moves the tensor's size through each of two ranks).
Two fresh processes run it, so the caller never joins a process group; it needs torch (`tally[serve]`).

    python -m tally.ledger.link_probe        # prints the measured link as JSON
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from tally.errors import TallyError
from tally.layers.spin_wait import wait_polling
from tally.ledger.comm import Link
from tally.ports import free_port

SMALL_NUMEL, LARGE_NUMEL = 1024, 1 << 20
WORK_ROWS = 96  # a ~0.1 ms matmul between collectives, as a layer's half of a decode step is here


def measure_gloo_link(calls: int = 300) -> Link:
    port = free_port()
    args = [sys.executable, "-m", "tally.ledger.link_probe", "--port", str(port), "--calls", str(calls), "--rank"]
    other = subprocess.Popen([*args, "1"], stdout=subprocess.DEVNULL)
    try:
        out = subprocess.run([*args, "0"], capture_output=True, text=True, timeout=120)
    finally:
        other.wait(timeout=30)
    if out.returncode != 0:
        raise TallyError(f"the gloo link probe failed: {out.stderr.strip().splitlines()[-1:]}")
    in_step_s, small_s, large_s = json.loads(out.stdout)
    bandwidth = LARGE_NUMEL * 4 / max(large_s - small_s, 1e-9)
    return Link("gloo (measured)", in_step_s, bandwidth, measured=True, backend="gloo")


def _rank_main(rank: int, port: int, calls: int) -> None:
    import torch
    import torch.distributed as dist

    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, wait_for_workers=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    small, large = torch.ones(SMALL_NUMEL), torch.ones(LARGE_NUMEL)
    work = torch.ones(WORK_ROWS, WORK_ROWS)
    for t in (small, large):  # connections and buffers warm
        for _ in range(20):
            dist.all_reduce(t)
    in_step = []
    for _ in range(calls):
        torch.mm(work, work)
        start = time.perf_counter()
        wait_polling(dist.all_reduce(small, async_op=True))
        in_step.append(time.perf_counter() - start)
    back_to_back = []
    for t in (small, large):
        times = []
        for _ in range(calls if t is small else max(calls // 10, 10)):
            start = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - start)
        back_to_back.append(statistics.median(times))
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps([statistics.mean(in_step), *back_to_back]))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rank", type=int)
    p.add_argument("--port", type=int)
    p.add_argument("--calls", type=int, default=300)
    ns = p.parse_args()
    if ns.rank is None:
        link = measure_gloo_link(ns.calls)
        print(json.dumps(link.__dict__))
    else:
        _rank_main(ns.rank, ns.port, ns.calls)
