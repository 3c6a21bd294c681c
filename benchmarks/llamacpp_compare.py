"""Tally vs llama.cpp's server on the same GGUF file, the same workloads, the same client (`tally bench`).

llama.cpp runs as its C++ `llama-server` (--llama-server PATH: built from llama.cpp's source with cmake, target
llama-server; --parallel 16 slots sharing a 16 x 2048-token context), or as `python -m llama_cpp.server` from
llama-cpp-python (--llama-python: an sdist that compiles llama.cpp, a long build, in its own virtual environment).
Both servers get --threads threads (default 1: on a shared 2-core machine two threads mostly wait on each other) and
the built-in SmolLM2-135M Q4_1 GGUF, or --model's GGUF. Tally runs its default (the path measured at start);
llama.cpp runs on the file's blocks with its own kernels. Prompts are cut with the same local tokenizer (the GGUF's),
and output lengths are forced on both (ignore_eos for Tally, a -inf logit bias on the end-of-turn tokens for
llama.cpp, whose OpenAI server has no ignore_eos).

Workloads:
  single    one client, fixed 64-token prompts and 64 output tokens: batch-1 decode speed as users see it
  streams   8 clients in a closed loop, fixed 64 / 32: what batching buys
  trace     Poisson arrivals at --rate with the Azure conversation trace's lengths / 16, SLO ttft=5s,tpot=1s
  trace16   16 clients in a closed loop with the trace's lengths / 16: serving throughput at 16 streams

    python benchmarks/llamacpp_compare.py (--llama-server PATH | --llama-python PATH) [--model GGUF] [--threads 1]
        [--duration 60] [--rate 0.3] [--only single,streams,trace,trace16]
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from peer_env import peer_env  # benchmarks/ is on sys.path when a script here runs
from serve_demos import scaled_trace, warm_up

from tally.server.process import ServerProcess

SLO = "ttft=5s,tpot=1s"


def gguf_path(model: str | None) -> Path:
    from tally.models.registry import resolve_model

    return resolve_model(model).path


def write_tokenizer(model: str | None, out: Path) -> tuple[Path, list[int]]:
    """tokenizer.json of the GGUF (None: the built-in one), and its end-of-turn token ids."""
    from tally.models.loader import load_checkpoint
    from tally.models.tokenizer import load_tokenizer

    ckpt = load_checkpoint(model)
    tok = load_tokenizer(ckpt)
    tok.save_pretrained(str(out))
    eos = sorted({i for i in (tok.eos_token_id, *ckpt.config.eos_token_ids) if i is not None})
    return out / "tokenizer.json", eos


def workloads(ns: argparse.Namespace, trace: Path) -> dict[str, list[str]]:
    return {
        "single": ["--lengths", "fixed:64,64", "--concurrency", "1", "--requests", str(ns.single_requests)],
        "streams": ["--lengths", "fixed:64,32", "--concurrency", "8", "--duration", f"{ns.duration}s"],
        "trace": ["--lengths", f"trace:{trace}", "--rate", f"{ns.rate:g}", "--duration", f"{ns.duration}s"],
        "trace16": ["--lengths", f"trace:{trace}", "--concurrency", "16", "--duration", f"{ns.duration}s"],
    }


def run_bench(url: str, args: list[str], out: Path) -> dict:
    cmd = [sys.executable, "-m", "tally.cli", "bench", "--url", url, *args, "--slo", SLO, "--quiet",
           "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"tally bench exited {proc.returncode}: {proc.stderr[-2000:]}")
    result = json.loads(out.read_text())
    result["command_line"] = shlex.join(cmd)
    return result


def figures(result: dict) -> dict[str, float | None]:
    s = result["summary"]
    return {"output tok/s": s["throughput"]["output_tokens_per_s"],
            "TTFT P50 s": s["ttft_s"].get("p50"), "TTFT P99 s": s["ttft_s"].get("p99"),
            "TPOT P50 s": s["tpot_s"].get("p50"), "goodput req/s": s.get("goodput", {}).get("requests_per_s"),
            "mean output tokens": s["output_tokens"].get("mean"), "failed": s["counts"]["failed"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    peer = p.add_mutually_exclusive_group(required=True)
    peer.add_argument("--llama-server", help="llama.cpp's C++ llama-server binary")
    peer.add_argument("--llama-python", help="python of a venv with llama-cpp-python[server]")
    p.add_argument("--model", default=None, help="a GGUF file (default: the built-in model)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--duration", type=int, default=60)
    p.add_argument("--rate", type=float, default=0.3)
    p.add_argument("--single-requests", type=int, default=6)
    p.add_argument("--only", default="single,streams,trace,trace16")
    p.add_argument("--out-dir", type=Path, default=Path(tempfile.gettempdir()) / "tally_llamacpp")
    ns = p.parse_args()
    ns.out_dir.mkdir(parents=True, exist_ok=True)
    os.environ["OMP_NUM_THREADS"] = str(ns.threads)
    trace, _, _ = scaled_trace(ns.out_dir / "conv_div16.csv", 16)
    tokenizer, eos = write_tokenizer(ns.model, ns.out_dir / "tokenizer")
    gguf = gguf_path(ns.model)
    ban_eos = json.dumps({"logit_bias": {str(i): -1e9 for i in eos}})
    threads = str(ns.threads)

    def llama_command(port: int) -> list[str]:
        if ns.llama_server:
            return [ns.llama_server, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-t", threads,
                    "-tb", threads, "--parallel", "16", "-c", str(16 * 2048), "--log-disable"]
        return [ns.llama_python, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1", "--port",
                str(port), "--n_threads", threads, "--n_threads_batch", threads, "--n_ctx", "2048", "--verbose",
                "False", "--interrupt_requests", "False"]

    servers = {
        "tally": (ServerProcess([*([ns.model] if ns.model else []), "--max-model-len", "2048", "--kv-cache-memory", "512MiB", "--log-level", "warning",
                                 "--threads", threads]),
                  ["--extra-body", '{"ignore_eos": true}']),
        "llama.cpp": (ServerProcess([], command=llama_command, health_path="/v1/models", base_env=peer_env()),
                      ["--extra-body", ban_eos]),
    }
    chosen = [w for w in ns.only.split(",") if w]
    results: dict[str, dict[str, dict]] = {}
    for name, (server, extra) in servers.items():
        server.start()
        try:
            warm_up(server.url)
            for wl, args in workloads(ns, trace).items():
                if wl in chosen:
                    t0 = time.monotonic()
                    res = run_bench(server.url, [*args, "--tokenizer", str(tokenizer), *extra],
                                    ns.out_dir / f"{name}_{wl}.json")
                    results.setdefault(wl, {})[name] = res
                    print(f"{name} {wl}: {json.dumps(figures(res))} ({time.monotonic() - t0:.0f} s)", flush=True)
        finally:
            server.stop()
    print(f"\nmodel: {gguf.name}; {ns.threads} thread(s) each; load average {os.getloadavg()[0]:.1f}; SLO {SLO}\n")
    for wl, by_server in results.items():
        print(f"### {wl}: {' '.join(workloads(ns, trace)[wl])}\n")
        cols = list(figures(next(iter(by_server.values()))))
        print("| server | " + " | ".join(cols) + " |\n|---|" + "---|" * len(cols))
        for name, res in by_server.items():
            f = figures(res)
            print(f"| {name} | " + " | ".join("-" if v is None else f"{v:.3g}" for v in f.values()) + " |")
        if len(by_server) == 2:
            a, b = (figures(by_server[n]) for n in ("tally", "llama.cpp"))
            print("| tally / llama.cpp | " + " | ".join(
                f"{a[c] / b[c]:.2f}×" if isinstance(a[c], float) and isinstance(b[c], float) and b[c] else ""
                for c in cols) + " |")
        print("\ncommands:\n" + "\n".join(f"    {r['command_line']}" for r in by_server.values()) + "\n")
    print(f"command: python {shlex.join(sys.argv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
