"""Decode-step time with 1 and 2 threads, on a quiet machine and beside one busy neighbour process, with OpenMP's
waiting threads passive (Tally's default) and spinning (libgomp's default): does a busy core collapse a step?

Each cell runs in a fresh process (libgomp reads OMP_WAIT_POLICY once, at load): the built-in model's batch-1
decode, median step time over 64 tokens. The neighbour is a Python process spinning on one core.

    python benchmarks/threads_contention.py [--model PATH] [--tokens 64] [--extra-args '--dtype float32']
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

_CELL = r"""
import json, statistics, sys
from tally import LLM, SamplingParams
kwargs = json.loads(sys.argv[1])
llm = LLM(**kwargs, max_model_len=256, kv_cache_memory=64 * 2**20)
p = SamplingParams(temperature=0, max_tokens=int(sys.argv[2]), ignore_eos=True)
llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
steps = []
for _ in range(3):
    m = llm.generate("Once upon a time", p)[0].metrics
    steps.append((m.last_token_time - m.first_token_time) / (int(sys.argv[2]) - 1))
print(json.dumps({"step_ms": statistics.median(steps) * 1e3, "path": llm.engine.ledger.path["summary"]}))
"""
_SPIN = "while True: pass"


def cell(kwargs: dict, tokens: int, policy: str, busy: bool) -> dict:
    """`policy`: an OMP_WAIT_POLICY value, or NAME=VALUE for another variable (GOMP_SPINCOUNT=10000)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    name, _, value = policy.rpartition("=")
    env[name or "OMP_WAIT_POLICY"] = value
    spinner = subprocess.Popen([sys.executable, "-c", _SPIN]) if busy else None
    try:
        out = subprocess.run([sys.executable, "-c", _CELL, json.dumps(kwargs), str(tokens)], env=env,
                             capture_output=True, text=True, timeout=900)
    finally:
        if spinner is not None:
            spinner.kill()
    if out.returncode != 0:
        raise SystemExit(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--quantization", default=None)
    p.add_argument("--policies", default="PASSIVE,ACTIVE", help="comma-separated: OMP_WAIT_POLICY values or "
                   "NAME=VALUE, e.g. GOMP_SPINCOUNT=10000")
    a = p.parse_args()
    base = {"model": a.model, "dtype": a.dtype, "quantization": a.quantization}
    print(f"{'policy':<22} {'machine':<8} {'1 thread ms':>12} {'2 threads ms':>13}  2 threads / 1 thread quiet")
    quiet_one = None
    for policy in a.policies.split(","):
        for busy in (False, True):
            one = cell({**base, "threads": 1}, a.tokens, policy, busy)
            two = cell({**base, "threads": 2}, a.tokens, policy, busy)
            if quiet_one is None:
                quiet_one = one["step_ms"]
                print(f"path: {one['path']}")
            print(f"{policy:<22} {'busy' if busy else 'quiet':<8} {one['step_ms']:>12.1f} {two['step_ms']:>13.1f}  "
                  f"{two['step_ms'] / quiet_one:.2f}x", flush=True)
    print("command: python " + " ".join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
