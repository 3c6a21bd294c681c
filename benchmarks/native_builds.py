"""Every build of the native kernels this CPU runs (tally/native/library.py:builds: avx2, vnni256, avx512,
avx512_gfni, avx512_amx), against each other in one process on the integer projections of a real model's shapes: ms per call,
best of several alternating runs, and each build's time over the widest one's. Random weights: the kernels' time
does not depend on the values.

    python benchmarks/native_builds.py [--threads 1] [--rows 1,4] [--shapes 9728x896,896x4864,151936x896] [--copies 12]
                                  [--define PAIR_ROWS=4,5] [--builds avx512_gfni,avx512_amx] [--baseline REF]
                                  [--formats int4,int6] [--alternations 2] [--best-of 7]

--copies N: each call goes over N copies of the weights in turn (ms per copy), so that they stream from memory as
a decode step's layers do, rather than from the last-level cache (a 9728x896 int4 matrix is 4.4 MB).
--define NAME=V1,V2: the widest build at each value of a kernel constant, the same way (each / the last value).
--builds A,B: only these builds (each / the last named).
--baseline REF: the build this CPU loads, at git ref REF and in this checkout (REF / this checkout): a change to the
kernels against the version before it. Its results differ where the change changed the arithmetic.
--alternations N: rounds of every build in turn (default 2). Each ratio is the median over the rounds of that round's
time over the widest build's, so a host whose speed drifts between minutes (a shared VM's) moves both sides of a ratio
together, where a ratio of two bests compares one build's lucky minute with the other's; on such a host take 15-25
rounds with --best-of 1 (--best-of K: a build's timed runs in a round, the best kept; default 7).
--formats int4,int6: only the formats whose names start so.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import tally  # noqa: F401  first: it sets OpenMP's waiting policy before torch loads libgomp
import torch
from batch_invariance import baseline_build  # benchmarks/ is on sys.path when a script here runs

from tally.native import library, ops


def best_ms(fn: Callable[[], None], calls: int, rounds: int) -> float:
    fn()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e3


def formats(n: int, k: int) -> dict[str, tuple]:
    """name -> (qs, qh, scales, mins, group, bits) for tally_gemm_q4, or (q, scales) for tally_gemm_q8. Per-group
    values in the form a GGUF's load gives them (int_dots.h: GroupValues): fp16 for Q5_0 and Q8_0, super-blocks of
    256 factored for Q4_K and Q6_K where k is a multiple of 256 (else fp16, as Q4_1 and Q4_0 hold them)."""
    def half(group: int) -> torch.Tensor:
        return ops.pack_tile_scales(torch.rand(n, k // group) / 64, half=True)

    def k_quant(group: int) -> torch.Tensor:
        if k % 256:
            return half(group)
        return ops.pack_tile_factors(torch.rand(n, k // 256).half() / 64, torch.randint(-63, 64, (n, k // group)))

    q5, qh5 = ops.pack_planes(torch.randint(0, 32, (n, k), dtype=torch.uint8), 5)
    q6, qh6 = ops.pack_planes(torch.randint(0, 64, (n, k), dtype=torch.uint8), 6)
    return {"int4 (Q4_K/Q4_1)": (ops.pack_q4(torch.randint(0, 16, (n, k), dtype=torch.uint8)), None, k_quant(32),
                                 k_quant(32), 32, 4),
            "int5 (Q5_0)": (q5, qh5, half(32), None, 32, 5),
            "int6 (Q6_K)": (q6, qh6, k_quant(16), None, 16, 6),
            "int8 (Q8_0)": (ops.pack_q8(torch.randint(-127, 128, (n, k), dtype=torch.int8)), half(32))}


def ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def call_all(lib, x: torch.Tensor, y: torch.Tensor, n: int, copies: list[tuple]) -> Callable[[], None]:
    calls = [call(lib, x, y, n, fmt) for fmt in copies]

    def run() -> None:
        for c in calls:
            c()
    return run


def call(lib, x: torch.Tensor, y: torch.Tensor, n: int, fmt: tuple) -> Callable[[], None]:
    if len(fmt) == 2:
        q, s = fmt
        form, symmetric = ops.scale_form(s), ops.symmetric_q8(q)  # once, as a layer holds them: not timed
        return lambda: lib.tally_gemm_q8(x.data_ptr(), q.data_ptr(), s.data_ptr(), None, y.data_ptr(), x.shape[0], n,
                                         x.shape[1], 32, 0, 0, form, symmetric)
    qs, qh, d, m, group, bits = fmt
    form = ops.scale_form(d, m)
    return lambda: lib.tally_gemm_q4(x.data_ptr(), qs.data_ptr(), ptr(qh), d.data_ptr(), ptr(m), None, y.data_ptr(),
                                     x.shape[0], n, x.shape[1], group, bits, 0, form)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rows", default="1,4")
    p.add_argument("--shapes", default="9728x896,896x4864,151936x896", help="NxK: outputs x inputs (Qwen 0.5B's "
                   "gate/up, down and LM head by default)")
    p.add_argument("--copies", type=int, default=1, help="copies of each shape's weights, one after another")
    p.add_argument("--define", default=None, help="NAME=V1,V2,..: instead of every build, the widest one with the C "
                   "macro NAME at each value (one the source guards with #ifndef, e.g. PAIR_ROWS=4,5)")
    p.add_argument("--builds", default=None, help="A,B,..: only these builds, the last the reference")
    p.add_argument("--baseline", default=None, help="git ref: its kernels (the build this CPU loads) against this "
                   "checkout's")
    p.add_argument("--alternations", type=int, default=2, help="rounds of every build in turn; ratios: their median")
    p.add_argument("--best-of", type=int, default=7, help="timed runs of a build in a round, the best kept")
    p.add_argument("--formats", default=None, help="fmt,..: only the formats whose names start so (int4,int6)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    builds = library.builds()
    if a.builds:
        builds = {name: builds[name] for name in a.builds.split(",")}
    if a.define:
        macro, values = a.define.split("=")
        widest_flags = list(builds.values())[-1]
        builds = {f"{macro}={v}": [*widest_flags, f"-D{macro}={v}"] for v in values.split(",")}
    if a.baseline:
        builds = {a.baseline: None, "this checkout": builds[library.build_wanted()]}
    names = list(builds)
    libs = {name: baseline_build(name) if flags is None else library.load_build(flags)
            for name, flags in builds.items()}
    widest = names[-1]
    print(f"builds: {', '.join(names)}; {a.threads} thread(s); ms per call, best of {a.best_of} x {a.alternations} "
          f"alternating; each build / {widest}: the median of the rounds' ratios")
    for shape in a.shapes.split(","):
        n, k = map(int, shape.split("x"))
        copies = [formats(n, k) for _ in range(a.copies)]
        for rows in map(int, a.rows.split(",")):
            x, y = torch.randn(rows, k), torch.empty(rows, n)
            for fmt_name in copies[0]:
                if a.formats and not fmt_name.startswith(tuple(a.formats.split(","))):
                    continue
                calls = max(3, int(2e7 // (n * k * a.copies)))
                runs = {name: call_all(libs[name], x, y, n, [c[fmt_name] for c in copies]) for name in names}
                rounds = [{name: best_ms(runs[name], calls, a.best_of) / a.copies for name in names}
                          for _ in range(a.alternations)]
                times = {name: min(r[name] for r in rounds) for name in names}
                ratio = {name: statistics.median(r[name] / r[widest] for r in rounds) for name in names}
                cells = "  ".join(f"{name} {times[name]:7.3f}" + (f" ({ratio[name]:.2f}x)"
                                                                  if name != widest else "") for name in names)
                print(f"{n}x{k} rows {rows:<3} {fmt_name:<17} {cells}", flush=True)
    print("command: python " + " ".join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
