"""What oneDNN's compiled-kernel cache costs a bf16 matmul that meets many row counts, with and without Tally's row
buckets (tally/quant/base.py): resident memory after each batch of new row counts, and the time per call.

A prefill step's rows are its tokens, so a server meets a new shape at nearly every prompt; oneDNN compiles and keeps
a kernel per shape (up to 1,024). Each arm runs in a fresh process, so neither inherits the other's cache.

    python benchmarks/kernel_cache_memory.py [--rows 1250] [--shape 1536x576] [--threads 1]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def arm(bucketed: bool, rows: int, n: int, k: int, threads: int) -> dict:
    import torch

    from tally.quant.base import pad_rows

    torch.set_num_threads(threads)
    weight_t = torch.randn(n, k).to(torch.bfloat16).t()

    def rss_mib() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2**20

    def matmul(m: int) -> None:
        x = torch.randn(m, k).to(torch.bfloat16)
        (pad_rows(x) if bucketed else x) @ weight_t

    for m in range(1, 17):  # the allocator and the first kernels, outside the figures
        matmul(m)
    start_mib, marks, started = rss_mib(), [], time.perf_counter()
    points = {17 + (rows - 17) * i // 4 for i in range(1, 5)}  # four readings, the last at `rows`
    for m in range(17, rows + 1):
        matmul(m)
        if m in points:
            marks.append((m - 16, rss_mib() - start_mib))
    return {"marks": marks, "ms_per_call": (time.perf_counter() - started) / (rows - 16) * 1e3}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1250, help="row counts to meet, 17 to this")
    p.add_argument("--shape", default="1536x576", help="the weight, out x in")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--arm", choices=("raw", "bucketed"), help=argparse.SUPPRESS)
    ns = p.parse_args()
    n, k = (int(v) for v in ns.shape.split("x"))
    if ns.arm:
        print(json.dumps(arm(ns.arm == "bucketed", ns.rows, n, k, ns.threads)))
        return
    runs = {}
    for name in ("raw", "bucketed"):
        out = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--arm", name], capture_output=True,
                             text=True, check=True)
        runs[name] = json.loads(out.stdout.splitlines()[-1])
    print(f"bf16 matmul, weight {n}x{k}, {ns.threads} thread(s): resident memory added as new row counts arrive")
    print(f"{'row counts met':>15} {'raw MiB':>9} {'bucketed MiB':>13} {'raw / bucketed':>15}")
    for (m, raw), (_, bucketed) in zip(runs["raw"]["marks"], runs["bucketed"]["marks"]):
        print(f"{m:>15,} {raw:>9.0f} {bucketed:>13.0f} {raw / max(bucketed, 1):>15.1f}")
    raw_ms, bucketed_ms = runs["raw"]["ms_per_call"], runs["bucketed"]["ms_per_call"]
    print(f"mean ms per call (a first call compiles): raw {raw_ms:.2f}, bucketed {bucketed_ms:.2f}, "
          f"bucketed / raw {bucketed_ms / raw_ms:.2f}")
    print(f"command: python {' '.join(sys.argv)}")


if __name__ == "__main__":
    main()
