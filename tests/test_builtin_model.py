"""The built-in SmolLM2-135M (GGUF Q4_1): dequantized (quantization="none") in fp32, greedy tokens identical to
transformers loading the same file (dequantized) in fp32, logprobs within 1e-3."""
from __future__ import annotations

import pytest
from support.engine_checks import assert_no_block_leak, hf_greedy

from tally import LLM, SamplingParams

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def llm():
    return LLM(None, dtype="float32", quantization="none", max_model_len=512, kv_cache_memory=64_000_000)


def test_builtin_model_greedy_matches_transformers(llm, builtin_hf_model):
    tok = llm.get_tokenizer()
    chat = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                   add_generation_prompt=True, tokenize=False)
    prompts = [chat, "def fibonacci(n):"]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=0)
    outs = llm.generate([{"prompt_token_ids": tok.encode(p, add_special_tokens=False)} for p in prompts], params)
    for prompt, out in zip(prompts, outs):
        ref_ids, ref_lp = hf_greedy(builtin_hf_model, tok.encode(prompt, add_special_tokens=False), 24)
        got = out.outputs[0]
        assert got.token_ids == ref_ids
        got_lp = [d[t].logprob for d, t in zip(got.logprobs, got.token_ids)]
        assert max(abs(a - b) for a, b in zip(got_lp, ref_lp)) < 1e-3
    assert "Paris" in outs[0].outputs[0].text
    assert_no_block_leak(llm)
