"""Greedy outputs and logprobs match Hugging Face transformers on the same weights (fp32)."""
from __future__ import annotations

import pytest
from support.engine_checks import assert_no_block_leak, hf_greedy

from tally import LLM, SamplingParams

PROMPTS = [
    "Paris is the capital of",
    "def add(a, b):\n    return",
    "The quick brown fox jumps over the lazy dog. " * 4,  # longer than the mistral window (12)
]


@pytest.mark.parametrize("arch", ["llama", "llama_tied_mqa", "qwen2", "mistral", "qwen3"])
def test_greedy_tokens_and_logprobs_match_transformers(tiny_model_factory, arch):
    model_dir = tiny_model_factory(arch)
    llm = LLM(str(model_dir), dtype="float32", kv_cache_memory=2_000_000, max_num_batched_tokens=64)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=0)
    outs = llm.generate(PROMPTS, params)
    tok = llm.get_tokenizer()
    for prompt, out in zip(PROMPTS, outs):
        ref_ids, ref_lps = hf_greedy(model_dir, tok.encode(prompt), 12)
        got = out.outputs[0]
        assert got.token_ids == ref_ids, f"{arch}: {prompt!r}"
        lps = [next(iter(d.values())).logprob if len(d) == 1 else d[t].logprob
               for d, t in zip(got.logprobs, got.token_ids)]
        assert max(abs(a - b) for a, b in zip(lps, ref_lps)) < 1e-3
        assert got.finish_reason == "length"
    assert_no_block_leak(llm)
