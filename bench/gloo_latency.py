"""What one collective costs on this machine, alone: two processes all-reducing a hidden state over gloo, as a
tensor-parallel layer does twice (bench/tensor_parallel.py measures them inside the model).

    python bench/gloo_latency.py [--numel 576] [--calls 2000]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist


def rank_main(rank: int, port: int, numel: int, calls: int, pin: bool) -> None:
    if pin:
        os.sched_setaffinity(0, {rank % (os.cpu_count() or 1)})
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, wait_for_workers=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    t = torch.ones(numel)
    for _ in range(100):  # connections and buffers warm
        dist.all_reduce(t)
    start = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(t)
    if rank == 0:
        print(f"{'pinned' if pin else 'unpinned':>9}: all_reduce of {numel} fp32 between 2 processes: "
              f"{(time.perf_counter() - start) / calls * 1e6:.0f} µs each")
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--numel", type=int, default=576, help="elements per all-reduce (the built-in model's hidden size)")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--pin", action="store_true", help=argparse.SUPPRESS)
    ns = p.parse_args()
    if ns.rank is not None:
        rank_main(ns.rank, ns.port, ns.numel, ns.calls, ns.pin)
        return
    for pin in (True, False):
        port = 20000 + os.getpid() % 20000
        args = [sys.executable, __file__, "--numel", str(ns.numel), "--calls", str(ns.calls), "--port", str(port)]
        args += ["--pin"] * pin
        other = subprocess.Popen(args + ["--rank", "1"])
        subprocess.run(args + ["--rank", "0"], check=True)
        other.wait()


if __name__ == "__main__":
    main()
