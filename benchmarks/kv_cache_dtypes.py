"""The KV cache's dtype at long contexts: per --kv-cache-dtype, the prefill of a real-text prompt (TTFT) and the
decode step after it (TPOT), with the fp32 cache's times over each in the same run; and what the rounding costs
against the fp32 cache (exact: the oracle's arithmetic): the prompt's per-token logprobs (mean |difference|, and
the perplexity ratio) and how many of the greedy tokens match.

The logprob figures measure the cache's rounding only where the projections are exact in fp32 (`--dtype float16
--quantization none`: fp16 weights, fp32 arithmetic); with a GGUF's blocks as stored, activations are rounded to
int8 per block of 32, and any change upstream flips some of those roundings, whatever changed.

At a long context a decode step reads the cache's every byte for attention; fp16 / bf16 halve fp32's bytes and int8
quarters them (the native kernels read each in place, fp32 arithmetic). One engine per dtype in one process, called
in turn, best of --rounds.

    python benchmarks/kv_cache_dtypes.py [--contexts 500,1500,3000] [--max-tokens 48] [--rounds 2] [--model M]
                                    [--dtype auto] [--quantization Q]
"""
from __future__ import annotations

import argparse
import sys

import tally  # noqa: F401  first: it sets OpenMP's waiting policy before torch loads libgomp
import torch
from workload import corpus_token_ids

DTYPES = ("float32", "float16", "bfloat16", "int8")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--contexts", default="500,1500,3000")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--model", default=None)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--quantization", default=None)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    from tally import LLM, SamplingParams
    from tally.ledger.kv import KV_DTYPE_BYTES

    contexts = [int(c) for c in a.contexts.split(",")]
    longest = max(contexts) + a.max_tokens + 16
    # 64 KiB a token: one sequence in fp32 for the built-in model (46 KB) and Qwen2.5-0.5B (24 KB)
    engines = {d: LLM(a.model, dtype=a.dtype, quantization=a.quantization, kv_cache_dtype=d, max_model_len=longest,
                      kv_cache_memory=longest * 2**16, enable_prefix_caching=False, threads=a.threads)
               for d in DTYPES}
    ids = corpus_token_ids(engines["float32"].get_tokenizer())
    params = SamplingParams(temperature=0, max_tokens=a.max_tokens, ignore_eos=True)
    scoring = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    print(f"{a.threads} threads; {a.max_tokens} greedy tokens after each prompt; best of {a.rounds} rounds; "
          f"model {a.model or 'built-in'}, dtype {a.dtype}, quantization {a.quantization or 'default'}")
    print("| context | KV dtype | bytes a value | TTFT s | fp32 / it | TPOT ms | fp32 / it | prompt logprob mean "
          "abs diff | perplexity ratio | greedy tokens as fp32's |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for context in contexts:
        prompt = {"prompt_token_ids": ids[:context]}
        logprobs = {d: torch.tensor([next(iter(e.values())).logprob for e in llm.generate(prompt, scoring)[0]
                                     .prompt_logprobs[1:]]) for d, llm in engines.items()}
        ttft, tpot, tokens = {}, {}, {}
        for _ in range(a.rounds):
            for d, llm in engines.items():
                out = llm.generate(prompt, params)[0]
                m = out.metrics
                step = (m.last_token_time - m.first_token_time) / (a.max_tokens - 1)
                ttft[d], tpot[d] = min(ttft.get(d, 1e9), m.ttft_s), min(tpot.get(d, 1e9), step)
                tokens[d] = out.outputs[0].token_ids
        exact = logprobs["float32"]
        for d in DTYPES:
            same = next((i for i, (x, y) in enumerate(zip(tokens[d], tokens["float32"])) if x != y), a.max_tokens)
            diff, ppl = (logprobs[d] - exact).abs().mean(), (exact.mean() - logprobs[d].mean()).exp()
            print(f"| {context:,} | {d} | {KV_DTYPE_BYTES[d]} | {ttft[d]:.3f} | {ttft['float32'] / ttft[d]:.2f}× | "
                  f"{tpot[d] * 1e3:.1f} | {tpot['float32'] / tpot[d]:.2f}× | {diff:.5f} | {ppl:.5f} | "
                  f"first {same} of {a.max_tokens} |", flush=True)
    print("\ncommand: python " + " ".join(sys.argv))


if __name__ == "__main__":
    main()
