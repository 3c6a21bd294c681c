"""What batch-invariant numerics cost: this Tally against another version (a git ref, e.g. the commit before them),
alternating in one run, each in a process of its own, on the built-in GGUF and on the same model dequantized to a
dense checkpoint (fp16 panels, fp32 arithmetic: the path a bf16 Hugging Face checkpoint takes on AVX2 CPUs), and on
it in fp32 (native fp32 panels now, PyTorch's BLAS before them), in bf16 (`--dtype bfloat16`) and with the int8 KV
cache (--models picks some of these). Prefill: one 512-token prompt; decode: 1 and 8 greedy
streams of 64 tokens; mixed: 16 requests of 8-256 prompt tokens and 16-64 new ones at once, what a server's steps
hold (prompt chunks beside decodes), output tokens a second. Best of --repeats per cell, the spread (worst over best)
beside it. --kernels: the fp16-panel projection kernel alone, both versions' builds loaded in this process, on
SmolLM2-135M's shapes (8 layers' weights, so they stream from memory as a decode step's do); --fp32-kernels: the fp32
panels against torch's F.linear on the same shapes, this version alone; --bf16-kernels: the bf16 panels against torch's
bf16 F.linear.

    python benchmarks/batch_invariance.py --baseline a533890 [--repeats 3] [--kernels] [--models "dense bf16,int8 KV"]
    python benchmarks/batch_invariance.py --fp32-kernels | --bf16-kernels [--repeats 3]
"""
from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"GGUF Q4_1": {}, "dense (fp16 panels)": {"quantization": "none"},
          "dense fp32": {"quantization": "none", "dtype": "float32"},
          "dense bf16": {"quantization": "none", "dtype": "bfloat16"},  # bf16 panels now, oneDNN / torch before
          "int8 KV": {"quantization": "none", "kv_cache_dtype": "int8"}}  # scales per token, native attention now
METRICS = ("prefill_tok_s", "decode1_tok_s", "decode8_tok_s", "mixed16_tok_s")

WORKLOAD = """
import json, sys, time
import tally
from tally import LLM, SamplingParams
llm = LLM(**json.loads(sys.argv[1]))
prompt = [11 + (i * 7919) % 4000 for i in range(512)]
def run(prompts, tokens):
    p = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    start = time.perf_counter()
    llm.generate([{"prompt_token_ids": q} for q in prompts], p, use_tqdm=False)
    return time.perf_counter() - start
run([prompt[:64]], 4)  # warm-up
prefill = run([prompt], 1)
streams = {n: [[11 + (i * 31 + s * 7) % 4000 for i in range(16)] for s in range(n)] for n in (1, 8)}
decode = {n: n * 63 / (run(streams[n], 64) - run(streams[n], 1)) for n in (1, 8)}
mixed = [(prompt[s * 13:s * 13 + 8 + s * 16], 16 + (s * 5) % 49) for s in range(16)]
start = time.perf_counter()
llm.generate([{"prompt_token_ids": q} for q, _ in mixed],
             [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for _, n in mixed], use_tqdm=False)
mixed_tok_s = sum(n for _, n in mixed) / (time.perf_counter() - start)
print(json.dumps({"prefill_tok_s": 512 / prefill, "decode1_tok_s": decode[1], "decode8_tok_s": decode[8],
                  "mixed16_tok_s": mixed_tok_s}))
"""


def export(ref: str, into: Path) -> Path:
    """The `tally` package as it was at `ref`, unpacked under `into`."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "tally"], check=True, capture_output=True).stdout
    tarfile.open(fileobj=io.BytesIO(archive)).extractall(into, filter="data")
    return into


def baseline_build(ref: str):
    """The kernels of the `tally` package at `ref`, the build this CPU loads, compiled and loaded beside this
    checkout's (a process may hold both)."""
    from tally.native import library

    here = library.SOURCE, library.HEADERS
    with tempfile.TemporaryDirectory() as tmp:
        native = export(ref, Path(tmp)) / "tally/native"
        library.SOURCE, library.HEADERS = native / "kernels.c", [native / h.name for h in library.HEADERS]
        try:
            return library.load_build(library.builds()[library.build_wanted()])
        finally:
            library.SOURCE, library.HEADERS = here


def measure(source: Path, kwargs: dict) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(source)}
    out = subprocess.run([sys.executable, "-c", WORKLOAD, json.dumps(kwargs)], env=env, check=True,
                         capture_output=True, text=True, cwd=source).stdout
    return json.loads(out.strip().splitlines()[-1])


SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # SmolLM2-135M: qkv, o, gate_up, down (N, K)
ROWS = (1, 2, 3, 8, 66, 512)


def kernel_table(baseline: str, repeats: int) -> None:
    """gemm_f16 of both versions, ms per layer's projections at each row count, best of `repeats` x 5 alternating."""
    import time

    import tally  # noqa: F401  first: it sets OpenMP's waiting policy before torch loads libgomp
    import torch

    from tally.native import library, ops

    libs = {"now": library.load(), "before": baseline_build(baseline)}
    layers = [[ops.pack_f16(torch.randn(n, k)) for n, k in SHAPES] for _ in range(8)]
    best = {(name, rows): float("inf") for name in libs for rows in ROWS}
    for rows in ROWS:
        xs = {k: torch.randn(rows, k) for _, k in SHAPES}
        ys = {n: torch.empty(rows, n) for n, _ in SHAPES}
        for _ in range(repeats * 5):
            for name, lib in libs.items():
                start = time.perf_counter()
                for panels in layers:
                    for (n, k), w in zip(SHAPES, panels):
                        lib.tally_gemm_f16(xs[k].data_ptr(), w.data_ptr(), None, ys[n].data_ptr(), rows, n, k, 0)
                best[(name, rows)] = min(best[(name, rows)], (time.perf_counter() - start) / len(layers) * 1e3)
    print(f"{'rows':>5} {'before ms':>10} {'now ms':>10} {'now/before speed':>17}")
    for rows in ROWS:
        b, n = best[("before", rows)], best[("now", rows)]
        print(f"{rows:>5} {b:>10.3f} {n:>10.3f} {b / n:>16.2f}x")


def panel_table(dtype_name: str, repeats: int) -> None:
    """fp32 or bf16 projections: the native panels (batch-invariant) against PyTorch's F.linear in that dtype (its BLAS
    or oneDNN), ms per layer's projections at each row count, best of `repeats` x 5 alternating."""
    import time

    import tally  # noqa: F401  first: it sets OpenMP's waiting policy before torch loads libgomp
    import torch
    import torch.nn.functional as F

    from tally.native import ops

    dtype = getattr(torch, dtype_name)
    gemm = ops.gemm_f32 if dtype == torch.float32 else ops.gemm_bf16
    weights = [[torch.randn(n, k).to(dtype) for n, k in SHAPES] for _ in range(8)]
    panels = [[ops.pack_f16(w, dtype) for w in layer] for layer in weights]
    arms = {"torch": lambda x, i, j: F.linear(x.to(dtype), weights[i][j]),
            "panels": lambda x, i, j: gemm(x, panels[i][j], SHAPES[j][0], None).to(dtype)}
    best = {(name, rows): float("inf") for name in arms for rows in ROWS}
    for rows in ROWS:
        xs = {k: torch.randn(rows, k) for _, k in SHAPES}
        for _ in range(repeats * 5):
            for name, arm in arms.items():
                start = time.perf_counter()
                for i in range(len(weights)):
                    for j, (_, k) in enumerate(SHAPES):
                        arm(xs[k], i, j)
                best[(name, rows)] = min(best[(name, rows)], (time.perf_counter() - start) / len(weights) * 1e3)
    print(f"{dtype_name}: {'rows':>5} {'torch ms':>10} {'panels ms':>10} {'panels/torch speed':>19}")
    for rows in ROWS:
        t, n = best[("torch", rows)], best[("panels", rows)]
        print(f"{rows:>5} {t:>10.3f} {n:>10.3f} {t / n:>18.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", help="git ref of the version to compare against")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated arms of: " + ", ".join(MODELS))
    parser.add_argument("--kernels", action="store_true", help="the fp16-panel kernel alone, both builds")
    parser.add_argument("--fp32-kernels", action="store_true",
                        help="fp32 panels against PyTorch's fp32 matmul, this version only (no --baseline needed)")
    parser.add_argument("--bf16-kernels", action="store_true",
                        help="bf16 panels against PyTorch's bf16 matmul, this version only (no --baseline needed)")
    args = parser.parse_args()
    if args.fp32_kernels or args.bf16_kernels:
        flag = "fp32" if args.fp32_kernels else "bf16"
        panel_table({"fp32": "float32", "bf16": "bfloat16"}[flag], args.repeats)
        print(f"python benchmarks/batch_invariance.py --{flag}-kernels --repeats {args.repeats}")
        return
    if args.baseline is None:
        parser.error("--baseline is needed, but with --fp32-kernels / --bf16-kernels")
    if args.kernels:
        kernel_table(args.baseline, args.repeats)
        print(f"python benchmarks/batch_invariance.py --baseline {args.baseline} --kernels --repeats {args.repeats}")
        return
    models = {m: MODELS[m] for m in args.models.split(",")}
    with tempfile.TemporaryDirectory() as tmp:
        versions = {"before": export(args.baseline, Path(tmp)), "now": ROOT}
        cells: dict[tuple[str, str, str], list[float]] = {}
        for _ in range(args.repeats):
            for model, kwargs in models.items():
                for name, source in versions.items():  # alternating: the host's load falls on both alike
                    for metric, value in measure(source, kwargs).items():
                        cells.setdefault((model, metric, name), []).append(value)
    print(f"{'model':<20} {'figure':<16} {'before':>9} {'now':>9} {'spread':>13} {'now/before':>10}")
    for model in models:
        for metric in METRICS:
            before, now = cells[(model, metric, "before")], cells[(model, metric, "now")]
            spread = f"{max(before) / min(before):.2f}/{max(now) / min(now):.2f}"
            print(f"{model:<20} {metric:<16} {max(before):>9.1f} {max(now):>9.1f} {spread:>13} "
                  f"{max(now) / max(before):>9.2f}x")
    print(f"python benchmarks/batch_invariance.py --baseline {args.baseline} --repeats {args.repeats} "
          f"--models '{args.models}'")


if __name__ == "__main__":
    main()
