"""The practitioner's quantization table: per scheme, memory, KV bytes per token, perplexity, task scores and speed,
all measured in one run on one model, so the speed ratios compare like with like on a shared machine.

Rows (--rows, comma list):
  fp32          dense, fp32 weights and compute
  bf16          dense, bf16 weights and compute (emulated on AVX2-only CPUs)
  fp16w         dense, fp16 weights with fp32 compute (`--dtype float16`; what `auto` picks on AVX2-only CPUs)
  int8          int8 per-channel weights, round-to-nearest at load (`--quantization int8`)
  int4          int4 group-128 weights (g64 where 128 does not divide the inputs), RTN at load (`--quantization int4`)
  int4-fl       int4 g128 with the first and last decoder layers dense
                (`tally quantize --keep-high-precision first,last`)
  w8a8          int8 weights and per-token int8 activations, SmoothQuant α=0.5 from 64 calibration samples
                (`tally quantize --scheme w8a8 --method smoothquant`)
  kv-int8       fp16w with an int8 KV cache (`--kv-cache-dtype int8`): compare it with the fp16w row
Every row but fp32 and bf16 runs as `--dtype float16` (fp32 compute; the embedding, the LM head and any layer
left dense in fp16), what a user of those options gets by default on this CPU.
Quality: perplexity on the held-out text `tally eval` uses and its task suites (greedy, same decoding for every
row; --limit items per suite file), each row against the first row. Speed: batch-1 decode tokens/s (one request,
--decode-tokens forced with ignore_eos, prefill time subtracted), prefill tokens/s (one prompt of --prefill-tokens),
and output tokens/s with --streams concurrent requests (64-token prompts, --stream-tokens each). Every prompt is a
different slice of held-out text, so prefix caching never helps a timing.

    python benchmarks/quant_table.py [--model PATH] [--rows fp32,int8,...] [--threads 1] [--json out.json]
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import tally  # noqa: F401  first: it sets OpenMP's waiting policy before torch loads libgomp
import torch

from tally import LLM, SamplingParams
from tally.ledger.kv import KVLayout
from tally.models.loader import load_checkpoint
from tally.models.tokenizer import load_tokenizer
from tally.quality.model_run import ModelSpec, run_model
from tally.quality.settings import Decoding, EvalSettings
from tally.quality.suites import DATA, build_workload, tokenize_heldout
from tally.quality.verdicts import compare_runs

ROWS = ("fp32", "bf16", "fp16w", "int8", "int4", "int4-fl", "w8a8", "kv-int8", "gguf")
GIB = 1 << 30


@dataclass
class Timings:
    decode_tok_s: float
    prefill_tok_s: float
    streams_tok_s: float


class PromptSource:
    """Distinct slices of held-out text: no two timed prompts share a prefix block."""

    def __init__(self, ids: list[int]) -> None:
        self.ids, self.pos = ids, 0

    def take(self, n: int) -> list[int]:
        if self.pos + n > len(self.ids):
            self.pos = 0
        self.pos += n
        return self.ids[self.pos - n:self.pos]


def quantized_dir(row: str, model: str | None, work: Path, log) -> str:
    from tally.quantize.layer import QuantizeOptions
    from tally.quantize.pipeline import QuantizeJob, run
    from tally.quantize.scheme import parse_scheme

    if row == "int4-fl":
        job = QuantizeJob(model, work / row, QuantizeOptions(parse_scheme("w4a16-g128"), "rtn"),
                          keep_high_precision="first,last")
    else:
        job = QuantizeJob(model, work / row, QuantizeOptions(parse_scheme("w8a8"), "smoothquant", alpha=0.5),
                          calib=DATA / "calibration.jsonl", samples=64, max_tokens=256)
    t0 = time.perf_counter()
    run(job)
    log(f"{row}: quantized checkpoint written in {time.perf_counter() - t0:.0f} s")
    return str(job.out)


def spec_for(row: str, model: str | None, max_len: int, work: Path, log) -> ModelSpec:
    common = dict(max_model_len=max_len, kv_cache_memory=256 << 20)
    if row in ("int4-fl", "w8a8"):
        return ModelSpec(quantized_dir(row, model, work, log), dtype="float16", **common)
    if row == "gguf":  # a GGUF file's own blocks (Q4_0/Q4_1/Q8_0) as stored, as llama.cpp runs them
        return ModelSpec(model, quantization="gguf", dtype="float32", **common)
    return ModelSpec(model, quantization={"int8": "int8", "int4": "int4"}.get(row),
                     dtype={"fp32": "float32", "bf16": "bfloat16"}.get(row, "float16"),
                     kv_cache_dtype="int8" if row == "kv-int8" else "auto", **common)


def best_s(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def time_speed(llm: LLM, source: PromptSource, args: argparse.Namespace) -> Timings:
    def gen(prompts: int, prompt_len: int, tokens: int):
        params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
        return lambda: llm.generate([{"prompt_token_ids": source.take(prompt_len)} for _ in range(prompts)], params)

    gen(1, 16, 4)()  # warm-up: first-call allocations, thread pools
    prefill_1 = best_s(gen(1, 32, 1), args.repeats)
    decode = best_s(gen(1, 32, 1 + args.decode_tokens), args.repeats)
    prefill = best_s(gen(1, args.prefill_tokens, 1), args.repeats)
    streams = best_s(gen(args.streams, 64, args.stream_tokens), 1)
    return Timings(args.decode_tokens / max(decode - prefill_1, 1e-9), args.prefill_tokens / prefill,
                   args.streams * args.stream_tokens / streams)


def measure_row(row: str, spec: ModelSpec, workload, decoding: Decoding, source: PromptSource,
                args: argparse.Namespace) -> dict:
    from tally.quality.model_run import open_model

    llm = open_model(spec, decoding)
    ledger = llm.engine.ledger
    layout: KVLayout = llm.engine.kv_layout
    quality = run_model(llm, spec, workload, decoding)
    speed = time_speed(llm, source, args)
    result = {"row": row, "label": spec.label(), "weight_bytes": ledger.weight_bytes,
              "kv_bytes_per_token": layout.bytes_per_token,
              "kv_tokens_per_gib": layout.num_blocks_for_budget(GIB) * layout.block_size,
              "decode_tok_s": speed.decode_tok_s, "prefill_tok_s": speed.prefill_tok_s,
              "streams_tok_s": speed.streams_tok_s, "quality_run_s": quality.run_s}
    del llm
    gc.collect()
    return result, quality


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="checkpoint dir or .gguf (default: the built-in SmolLM2-135M)")
    p.add_argument("--rows", default=",".join(ROWS), help=f"comma list of {', '.join(ROWS)}; the first is the baseline")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--ppl-tokens", type=int, default=2048)
    p.add_argument("--limit", type=int, default=4, help="items per task-suite file")
    p.add_argument("--decode-tokens", type=int, default=32)
    p.add_argument("--prefill-tokens", type=int, default=256)
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--stream-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2, help="best of N for the batch-1 timings")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        p.error(f"unknown rows {unknown}; choose from {', '.join(ROWS)}")
    torch.set_num_threads(args.threads)

    def log(line: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)

    decoding = Decoding(max_tokens=48, batch_size=32)
    settings = EvalSettings(suites=("ppl", "tasks"), decoding=decoding, ppl_tokens=args.ppl_tokens,
                            ppl_window_tokens=512, limit=args.limit)
    results, runs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        workload = source = None
        for row in rows:
            spec = spec_for(row, args.model, args.max_model_len, Path(tmp), log)
            if workload is None:  # prompts from the first row's tokenizer; every row shares it
                tok = load_tokenizer(load_checkpoint(spec.model))
                workload = build_workload(tok, args.max_model_len, settings.suites, settings.ppl_tokens,
                                          settings.ppl_window_tokens, decoding.max_tokens, settings.limit)
                source = PromptSource(tokenize_heldout(tok)["shakespeare"])
            result, run = measure_row(row, spec, workload, decoding, source, args)
            cmp, _ = compare_runs(workload.items, runs[0] if runs else run, run, settings)
            result["quality"] = {r.name: {"value": r.candidate, "loss": r.loss, "verdict": r.verdict} for r in cmp}
            results.append(result)
            runs.append(run)
            log(f"{row}: {json.dumps({k: v for k, v in result.items() if k != 'quality'})}")
    print_table(results, args)
    if args.json:
        Path(args.json).write_text(json.dumps({"command": " ".join(sys.argv), "rows": results}, indent=1))
    return 0


def print_table(results: list[dict], args: argparse.Namespace) -> None:
    base = results[0]
    suites = [k for k in base["quality"] if k.startswith("tasks/")]
    print(f"\nmodel: {args.model or 'built-in SmolLM2-135M'}; {args.threads} thread(s); baseline row: {base['row']}")
    head = ["row", "weights MiB", "KV B/token", "KV tokens/GiB", "ppl", "Δppl %", *[s[6:] for s in suites],
            "b1 decode tok/s", "prefill tok/s", f"{args.streams}-stream tok/s"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in results:
        q = r["quality"]
        ratio = r["decode_tok_s"] / base["decode_tok_s"]
        cells = [r["row"], f"{r['weight_bytes'] / 2**20:.0f}", f"{r['kv_bytes_per_token']:,}",
                 f"{r['kv_tokens_per_gib']:,}", f"{q['ppl']['value']:.2f}", f"{q['ppl']['loss']:+.2f}",
                 *[f"{q[s]['value']:.2f}" for s in suites],
                 f"{r['decode_tok_s']:.1f} ({ratio:.2f}×)", f"{r['prefill_tok_s']:.0f}", f"{r['streams_tok_s']:.1f}"]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
