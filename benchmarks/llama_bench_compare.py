"""Tally's default path against llama.cpp's own `llama-bench` on the same GGUF file, in the same run: prefill of
512 tokens and batch-1 decode of 128 (llama-bench's pp512 / tg128), the same threads.

llama-bench is built from llama.cpp's source with cmake (GGML_NATIVE=ON: the CPU at hand), e.g. from a PyPI sdist
that vendors it; this script only runs it. Tally runs with default settings (the path measured at start), random
prompt tokens, ignore_eos, medians of 3 (benchmarks/cpu_paths.py's measurement); llama-bench its default 5
repetitions, averaged. Runs alternate (llama.cpp, Tally, llama.cpp) so a drifting machine shows in the spread;
--rounds N repeats that N times and reports the median of the rounds' ratios (a noisy VM's single round can be
far off either way). Each round gives two ratios: against the faster of llama.cpp's two runs (the conservative one:
on a noisy VM the faster of two draws sits above a typical run) and against their mean (a drift between them
cancels, and neither engine gets a second draw).

    python benchmarks/llama_bench_compare.py --llama-bench PATH/llama-bench [--model PATH.gguf] [--threads 2]
                                        [--llama-bench-args "-rtr 1"] [--rounds 3]

The same script measures ik_llama.cpp (github ikawrakow/ik_llama.cpp, cmake GGML_NATIVE=ON, target llama-bench):
its llama-bench takes the same flags, and "-rtr 1" repacks the quantized tensors at load for its fastest kernels.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from cpu_paths import measure  # benchmarks/ is on sys.path when a script here runs
from peer_env import peer_env


def llama_bench(binary: str, model: str, threads: int, prefill: int, decode: int,
                extra: list[str]) -> tuple[float, float]:
    """(decode, prefill) tokens per second, llama-bench's averages."""
    out = subprocess.run([binary, "-m", model, "-t", str(threads), "-p", str(prefill), "-n", str(decode), "-o",
                          "json", *extra], check=True, capture_output=True, text=True, env=peer_env()).stdout
    rows = json.loads(out)
    by_kind = {("prefill" if r["n_prompt"] else "decode"): r["avg_ts"] for r in rows}
    return by_kind["decode"], by_kind["prefill"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--llama-bench", required=True, help="path to llama.cpp's llama-bench binary")
    p.add_argument("--model", required=True, help="a .gguf file")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prefill", type=int, default=512)
    p.add_argument("--decode", type=int, default=128)
    p.add_argument("--llama-bench-args", default="",
                   help='more llama-bench flags, e.g. "-rtr 1" (ik_llama.cpp\'s run-time repacking)')
    p.add_argument("--rounds", type=int, default=1, help="repeat (llama.cpp, Tally, llama.cpp); median ratios")
    a = p.parse_args()
    extra = a.llama_bench_args.split()
    faster, mean = [], []  # per round (decode, prefill): Tally over llama.cpp's faster run, over its two runs' mean
    for r in range(a.rounds):
        if a.rounds > 1:
            print(f"round {r + 1} of {a.rounds}")
        peer = [llama_bench(a.llama_bench, a.model, a.threads, a.prefill, a.decode, extra)]
        decode, prefill, path = measure(a.model, a.threads, a.prefill, a.decode, {})
        peer.append(llama_bench(a.llama_bench, a.model, a.threads, a.prefill, a.decode, extra))
        for name, (d, pf) in (("llama.cpp (first)", peer[0]), ("tally default", (decode, prefill)),
                              ("llama.cpp (last)", peer[1])):
            print(f"{name:<18} decode {d:7.1f} tok/s   prefill {pf:8.1f} tok/s")
        print(f"tally path: {path}")
        best = max(peer, key=lambda run: run[0]), max(peer, key=lambda run: run[1])
        faster.append((decode / best[0][0], prefill / best[1][1]))
        mean.append((2 * decode / (peer[0][0] + peer[1][0]), 2 * prefill / (peer[0][1] + peer[1][1])))
        for name, (d, pf) in (("the faster of its two runs", faster[-1]), ("the mean of its two runs", mean[-1])):
            print(f"tally / llama.cpp ({name}): decode {d:.2f}x, prefill {pf:.2f}x")
    if a.rounds > 1:
        for name, ratios in (("the faster", faster), ("the mean", mean)):
            decodes, prefills = sorted(d for d, _ in ratios), sorted(pf for _, pf in ratios)
            print(f"median of {a.rounds} rounds against {name}: decode {statistics.median(decodes):.2f}x "
                  f"({decodes[0]:.2f}-{decodes[-1]:.2f}), prefill {statistics.median(prefills):.2f}x "
                  f"({prefills[0]:.2f}-{prefills[-1]:.2f})")
    print("command: python " + " ".join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
