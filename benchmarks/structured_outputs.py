"""What constrained decoding costs: tokens/s of the built-in model answering with and without a JSON schema, at
1 and 32 streams, and the mask's own time per constrained token (llguidance computing the allowed tokens, and
turning its bitmask into the sampler's mask), measured in the same run.

    python benchmarks/structured_outputs.py [--concurrency 1,32] [--requests-per-slot 2] [--max-tokens 64]
"""
from __future__ import annotations

import argparse
import time

from closed_loop import closed_loop  # benchmarks/ is on sys.path when a script here runs

import tally.engine.runner as runner
from tally import LLM, SamplingParams
from tally.sampling_params import StructuredOutputsParams

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "city": {"type": "string", "maxLength": 24}, "tags": {"type": "array", "items": {"type": "string", "maxLength": 12},
                                                          "maxItems": 4}},
    "required": ["name", "age", "city", "tags"], "additionalProperties": False}
PROMPT = "<|im_start|>user\nDescribe a person (name, age, city, tags) as JSON.<|im_end|>\n<|im_start|>assistant\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", default="1,32")
    p.add_argument("--requests-per-slot", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=64)
    a = p.parse_args()
    llm = LLM(max_model_len=1024, kv_cache_memory=512 << 20)
    mask_s = [0.0, 0]
    timed = runner.allowed_tokens

    def allowed_tokens(matchers, vocab_size):  # the runner's mask call, timed
        start = time.perf_counter()
        out = timed(matchers, vocab_size)
        mask_s[0] += time.perf_counter() - start
        mask_s[1] += len(matchers)
        return out

    runner.allowed_tokens = allowed_tokens
    print("| streams | free tok/s | JSON schema tok/s | ratio | mask per constrained token |")
    print("|---|---|---|---|---|")
    for c in (int(x) for x in a.concurrency.split(",")):
        prompts = [PROMPT] * max(2, a.requests_per_slot * c)
        free = [SamplingParams(temperature=1.0, seed=i, max_tokens=a.max_tokens, ignore_eos=True)
                for i in range(len(prompts))]
        schema = [SamplingParams(temperature=1.0, seed=i, max_tokens=a.max_tokens,
                                 structured_outputs=StructuredOutputsParams(json=SCHEMA)) for i in range(len(prompts))]
        free_tok_s, _ = closed_loop(llm, prompts, c, free)
        mask_s[:] = [0.0, 0]
        constrained_tok_s, _ = closed_loop(llm, prompts, c, schema)
        per_token_ms = mask_s[0] / max(mask_s[1], 1) * 1e3
        print(f"| {c} | {free_tok_s:.1f} | {constrained_tok_s:.1f} | {constrained_tok_s / free_tok_s:.2f}× | "
              f"{per_token_ms:.2f} ms |", flush=True)
    flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items())
    print(f"\ncommand: python benchmarks/structured_outputs.py {flags}")


if __name__ == "__main__":
    main()
