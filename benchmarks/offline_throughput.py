"""Offline throughput on trace-shaped requests: Tally (continuous), Tally (--scheduling static) and
transformers `generate` (padded static batches), same model, same requests, one run.

    python benchmarks/offline_throughput.py --requests 200 [--dtype auto] [--hf-dtype float32] [--batches 8,16,32]

--batches: the static batch sizes, Tally's `--scheduling static` and transformers' padded batches alike.

--dtype is Tally's (auto: fp16 weights with fp32 compute on CPUs without bf16 instructions, see
tally/engine/config.py); --hf-dtype is transformers' (fp32 by default: its bf16 is emulated on such CPUs and
fp16 arithmetic is unusably slow), so each system runs its fastest correct configuration here.
"""
from __future__ import annotations

import argparse
import sys
import time

import tally  # noqa: F401  first: it sets OpenMP's waiting policy before torch loads libgomp
import torch
from workload import hf_model_from_gguf, make_requests, trace_lengths


def run_tally(reqs, dtype: str, scheduling: str, max_num_seqs: int, model: str | None) -> float:
    from tally import LLM, SamplingParams

    llm = LLM(model, dtype=dtype, scheduling=scheduling, max_num_seqs=max_num_seqs, max_model_len=2048,
              enable_prefix_caching=False)
    params = [SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True) for r in reqs]
    prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in reqs]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - t0
    assert sum(len(o.outputs[0].token_ids) for o in outs) == sum(r.max_tokens for r in reqs)
    return elapsed


def run_hf(reqs, dtype: torch.dtype, batch: int, gguf_path: str) -> float:
    model = hf_model_from_gguf(gguf_path, dtype)
    t0 = time.perf_counter()
    with torch.no_grad():
        for i in range(0, len(reqs), batch):
            chunk = reqs[i:i + batch]
            width = max(len(r.prompt_token_ids) for r in chunk)
            ids = torch.zeros(len(chunk), width, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for j, r in enumerate(chunk):  # left padding, as generate() wants for decoder-only models
                ids[j, width - len(r.prompt_token_ids):] = torch.tensor(r.prompt_token_ids)
                mask[j, width - len(r.prompt_token_ids):] = 1
            new = max(r.max_tokens for r in chunk)
            model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                           pad_token_id=0)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--scale", type=int, default=4, help="divide the trace's lengths by this")
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32", "float16"])
    p.add_argument("--hf-dtype", default="float32", choices=["bfloat16", "float32"])
    p.add_argument("--model", default=None)
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batches", default="8,16,32", help="static batch sizes, comma-separated")
    a = p.parse_args()
    batches = [int(b) for b in a.batches.split(",")]
    torch.set_num_threads(a.threads)
    from tally.models.loader import load_checkpoint
    from tally.models.tokenizer import load_tokenizer

    ckpt = load_checkpoint(a.model)
    tok = load_tokenizer(ckpt)
    reqs = make_requests(tok, trace_lengths(a.requests, a.scale))
    out_tokens = sum(r.max_tokens for r in reqs)
    rows = []
    t = run_tally(reqs, a.dtype, "continuous", 64, a.model)
    rows.append(("tally continuous (max_num_seqs 64)", t))
    for b in batches:
        rows.append((f"tally --scheduling static, batch {b}", run_tally(reqs, a.dtype, "static", b, a.model)))
    if not a.skip_hf:
        for b in batches:
            rows.append((f"transformers generate ({a.hf_dtype}), padded batch {b}",
                         run_hf(reqs, getattr(torch, a.hf_dtype), b, str(ckpt.path))))
    base = rows[0][1]
    print(f"\nworkload: {a.requests} requests, Azure conv trace lengths / {a.scale}, "
          f"{sum(len(r.prompt_token_ids) for r in reqs)} prompt + {out_tokens} output tokens, {a.dtype}, "
          f"{a.threads} threads")
    print(f"{'system':<42} {'time s':>8} {'out tok/s':>10} {'time vs tally':>14}")
    for name, t in rows:
        print(f"{name:<42} {t:8.1f} {out_tokens / t:10.1f} {t / base:13.2f}x")
    print("command: python " + " ".join(sys.argv))


if __name__ == "__main__":
    main()
