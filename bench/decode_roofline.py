"""Batch-1 decode speed against the memory-bandwidth roofline measured in the same run, and the
per-step time spent outside the model's kernels (Python overhead).

    python bench/decode_roofline.py [--dtype float32] [--quantization int4] [--tokens 128] [--threads 2]
"""
from __future__ import annotations

import argparse
import sys
import time

import tally  # noqa: F401  first: it sets OpenMP's waiting policy before torch loads libgomp
import torch


def measure_bandwidth_gbs(size_bytes: int = 1 << 30, repeats: int = 5) -> float:
    x = torch.ones(size_bytes // 4, dtype=torch.float32)
    x.sum()
    best = min(_timed(lambda: x.sum()) for _ in range(repeats))
    return size_bytes / best / 1e9


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def weight_bytes_read_per_step(model: torch.nn.Module, weight_bytes: int) -> int:
    """A decode step reads every weight once, except the embedding table when the LM head is a separate copy
    (untied, or fp16 weights, where the packed head cannot serve the lookup): it reads one row of it."""
    if model.embed_tokens is None:  # looked up in the head (one copy), or in a GGUF table's own blocks
        blocks = getattr(model, "embed_blocks", None)
        return weight_bytes - (blocks.weight_nbytes() if blocks is not None else 0)
    head = getattr(model.lm_head, "weight", None)
    if head is not None and head.data_ptr() == model.embed_tokens.data_ptr():
        return weight_bytes
    return weight_bytes - model.embed_tokens.numel() * model.embed_tokens.element_size()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--quantization", default=None)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    from tally import LLM, SamplingParams

    llm = LLM(a.model, dtype=a.dtype, quantization=a.quantization, max_model_len=1024, kv_cache_memory=256 * 2**20)
    ledger = llm.engine.ledger
    params = SamplingParams(temperature=0, max_tokens=a.tokens, ignore_eos=True)
    llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))  # warm up
    runs = []
    for _ in range(3):
        out = llm.generate("Once upon a time", params)[0]
        m = out.metrics
        runs.append((m.last_token_time - m.first_token_time) / (len(out.outputs[0].token_ids) - 1))
    step_s = sorted(runs)[1]
    model = llm.engine.model
    if model.native_step is None:  # Python overhead: the same steps with the profiler's view of torch kernel time
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
        kernel_s = sum(e.self_cpu_time_total for e in prof.key_averages()) / 1e6 / 16
    bw = measure_bandwidth_gbs()
    kv_bytes = ledger.kv_bytes_per_token * 64  # ~64 tokens of context read per step on average
    read_bytes = weight_bytes_read_per_step(llm.engine.model, ledger.weight_bytes)
    roofline_tok_s = bw * 1e9 / (read_bytes + kv_bytes)
    tok_s = 1 / step_s
    print(f"\nmodel {ledger.model_name}, compute {model.dtype}, projections {type(model.layers[0].qkv_proj).__name__}, "
          f"{a.threads} threads")
    print(f"{'figure':<44} {'value':>12}")
    print(f"{'weight bytes held / read per step':<44} {ledger.weight_bytes / 1e6:>6.1f} / {read_bytes / 1e6:.1f} MB")
    print(f"{'memory bandwidth (torch sum, this run)':<44} {bw:>9.1f} GB/s")
    print(f"{'roofline decode':<44} {roofline_tok_s:>8.1f} tok/s")
    print(f"{'tally batch-1 decode (median of 3)':<44} {tok_s:>8.1f} tok/s")
    if model.native_step is None:
        print(f"{'per step: measured / in torch ops':<44} {step_s * 1e3:>6.1f} / {kernel_s * 1e3:.1f} ms")
    else:  # the layers run inside one native call, which the torch profiler does not see
        print(f"{'per step (one native call for all layers)':<44} {step_s * 1e3:>6.1f} ms")
    print(f"{'tally / roofline':<44} {tok_s / roofline_tok_s:>11.0%}")
    print("command: python " + " ".join(sys.argv))


if __name__ == "__main__":
    main()
