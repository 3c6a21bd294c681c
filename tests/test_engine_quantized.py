"""`quantization=int8|int4|w8a8` builds every projection through tally/quant and serves requests."""
from __future__ import annotations

import pytest
from support.engine_checks import assert_no_block_leak

from tally import LLM, SamplingParams


@pytest.mark.parametrize("scheme", ["int8", "int4", "w8a8"])
def test_quantized_engine_generates_and_frees_its_blocks(tiny_llama, scheme):
    llm = LLM(str(tiny_llama), dtype="float32", quantization=scheme, kv_cache_memory=2_000_000)
    layer = llm.engine.model.layers[0].qkv_proj
    assert type(layer).__module__.startswith("tally.quant")
    out = llm.generate(["Paris is", "The quick brown fox"], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    assert all(len(o.outputs[0].token_ids) == 6 for o in out)
    assert_no_block_leak(llm)
