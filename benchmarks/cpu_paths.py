"""The default path against every explicit one, on the CPU at hand: batch-1 decode and prefill tokens per second,
measured in the same run, and the default's ratio to the best explicit path.

  default          no --dtype / --quantization: measured at start (tally/engine/startup/path_tuning.py), GGUF as stored
  gguf fp32        --dtype float32 --quantization gguf: the file's blocks on the native kernels, no bf16 prefill
  gguf bf16        --dtype bfloat16 --quantization gguf: the blocks on PyTorch's int4 / int8 layers in bf16
  dequant bf16     --dtype bfloat16 --quantization none: the file dequantized to bf16
  dequant fp16w    --dtype float16 --quantization none: dequantized to fp16 panels, fp32 compute

    python benchmarks/cpu_paths.py [--model PATH.gguf] [--threads 2] [--prefill 512] [--decode 64]
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

VARIANTS = {
    "default": {},
    "gguf fp32": {"dtype": "float32", "quantization": "gguf"},
    "gguf bf16": {"dtype": "bfloat16", "quantization": "gguf"},
    "dequant bf16": {"dtype": "bfloat16", "quantization": "none"},
    "dequant fp16w": {"dtype": "float16", "quantization": "none"},
}


def measure(model: str | None, threads: int, prefill: int, decode: int, kwargs: dict) -> tuple[float, float, str]:
    from tally import LLM, SamplingParams

    llm = LLM(model, threads=threads, max_model_len=prefill + decode + 16, enable_prefix_caching=False,
              kv_cache_memory=256 * 2**20, **kwargs)
    vocab = len(llm.get_tokenizer())
    rng = random.Random(0)

    def prompt(n: int) -> dict:
        return {"prompt_token_ids": [rng.randrange(100, min(vocab, 20_000)) for _ in range(n)]}

    once = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    llm.generate(prompt(prefill), once)  # warm-up: first calls, allocator
    prefills = []
    for _ in range(3):
        start = time.perf_counter()
        llm.generate(prompt(prefill), once)
        prefills.append(prefill / (time.perf_counter() - start))
    decodes = []
    params = SamplingParams(temperature=0, max_tokens=decode, ignore_eos=True)
    for _ in range(3):
        m = llm.generate(prompt(16), params)[0].metrics
        decodes.append((decode - 1) / (m.last_token_time - m.first_token_time))
    steps = llm.engine.config.num_scheduler_steps  # LLM()'s multi-step decode (tally serve: 1)
    return statistics.median(decodes), statistics.median(prefills), \
        f"{llm.engine.ledger.path['summary']}; decode steps a call: up to {steps}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="a .gguf file (default: the built-in SmolLM2)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prefill", type=int, default=512)
    p.add_argument("--decode", type=int, default=64)
    p.add_argument("--variants", default=",".join(VARIANTS))
    a = p.parse_args()
    rows = {}
    for name in a.variants.split(","):
        rows[name] = measure(a.model, a.threads, a.prefill, a.decode, VARIANTS[name])
        print(f"{name:<14} decode {rows[name][0]:7.1f} tok/s   prefill {rows[name][1]:8.1f} tok/s   {rows[name][2]}",
              flush=True)
    explicit = {k: v for k, v in rows.items() if k != "default"}
    if "default" in rows and explicit:
        best_decode = max(explicit.items(), key=lambda kv: kv[1][0])
        best_prefill = max(explicit.items(), key=lambda kv: kv[1][1])
        print(f"default / best explicit decode ({best_decode[0]}): {rows['default'][0] / best_decode[1][0]:.2f}x")
        print(f"default / best explicit prefill ({best_prefill[0]}): {rows['default'][1] / best_prefill[1][1]:.2f}x")
    print("command: python " + " ".join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
