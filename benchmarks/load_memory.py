"""What loading a model costs in memory: the peak resident set while `LLM(model)` starts against what stays resident
once it has, and the checkpoint's size. Each model loads in a fresh process, so one does not inherit another's pages.

The peak includes the checkpoint's file pages the reader mapped (page cache, reclaimable); what stays counts the
weights, the KV pool and the runtime. Before GGUF tensors were read on demand the builder held every weight
dequantized to fp32 at once (`tally/models/tensor_map.py`): several times the file.

    python benchmarks/load_memory.py [--model M ...] [--max-model-len 512]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys


def load(model: str | None, max_model_len: int) -> dict:
    from tally import LLM
    from tally.models.registry import resolve_model

    llm = LLM(model=model, max_model_len=max_model_len, use_tqdm_on_load=False)
    with open("/proc/self/statm") as f:
        resident = int(f.read().split()[1]) * 4096
    llm.engine.shutdown()
    path = resolve_model(model).path
    size = (os.path.getsize(path) if path.is_file()
            else sum(p.stat().st_size for p in path.glob("*.safetensors")))
    return {"peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "resident": resident, "file": size}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", nargs="*", default=[None], help="GGUF files or HF folders (default: the built-in)")
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(load(args.child or None, args.max_model_len)))
        return
    mib = 2 ** 20
    for model in args.model:
        run = subprocess.run([sys.executable, __file__, "--child", model or "", "--max-model-len",
                              str(args.max_model_len)], capture_output=True, text=True, check=True)
        got = json.loads(run.stdout.strip().splitlines()[-1])
        print(f"{model or 'built-in'}: file {got['file'] / mib:,.0f} MiB, peak RSS {got['peak'] / mib:,.0f} MiB "
              f"({got['peak'] / got['file']:.1f}x the file), resident after load {got['resident'] / mib:,.0f} MiB; "
              f"peak over resident {got['peak'] / got['resident']:.2f}x")


if __name__ == "__main__":
    main()
