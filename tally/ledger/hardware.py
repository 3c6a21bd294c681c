"""`--device cpu`: measure this machine instead of trusting a datasheet.

Read bandwidth is the best of 3 sums over a ~1 GB float32 array, split over one thread per core
(numpy releases the GIL inside a reduction, so the threads read memory in parallel). FLOP/s is the best
of 3 float32 matmuls of 1024^3 through numpy's BLAS. RAM is MemTotal (tally/platform.py).
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

from tally.ledger.presets import Device
from tally.platform import total_ram_bytes


def measure_read_bandwidth(array_bytes: int = 1 << 30, repeats: int = 3) -> float:
    """Bytes per second read by summing a large array, best of `repeats`."""
    import numpy as np

    threads = max(os.cpu_count() or 1, 1)
    data = np.ones(array_bytes // 4, dtype=np.float32)  # ones, not empty: pages must be really backed
    chunks = np.array_split(data, threads)
    best_s = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(repeats):
            start = time.perf_counter()
            list(pool.map(np.sum, chunks))
            best_s = min(best_s, time.perf_counter() - start)
    return data.nbytes / best_s


def measure_matmul_flops(n: int = 1024, repeats: int = 3) -> float:
    """float32 matmul FLOP/s (2 n^3 per product), best of `repeats`."""
    import numpy as np

    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b = a.T.copy()
    a @ b  # warm the BLAS thread pool before timing
    best_s = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best_s = min(best_s, time.perf_counter() - start)
    return 2 * n**3 / best_s


def probe_cpu(array_bytes: int = 1 << 30) -> Device:
    return Device(
        name=f"cpu ({os.cpu_count()} cores, measured)",
        memory_bytes=total_ram_bytes(),
        bandwidth_bytes_per_s=measure_read_bandwidth(array_bytes),
        flops_per_s=measure_matmul_flops(),
        measured=True,
    )
