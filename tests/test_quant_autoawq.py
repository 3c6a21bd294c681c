"""A checkpoint AutoAWQ writes (tally/models/hf_quantized.py reads its GEMM layout) serves AutoAWQ's weights: a tiny
model quantized here by AutoAWQ itself on CPU, held against transformers running AutoAWQ's own dequantization of it."""
from __future__ import annotations

import pytest
import torch
from support.quantized_producers import autoawq_reference, write_autoawq

from tally import LLM, SamplingParams
from tally.models.prefill import prefill

PROMPTS = ["Paris is the capital of", "def add(a, b):", "The quick brown fox"]
TOKENS = 8


@pytest.fixture(scope="module")
def awq_pair(tiny_llama, tmp_path_factory):
    path = write_autoawq(tiny_llama, tmp_path_factory.mktemp("autoawq"))
    return path, autoawq_reference(tiny_llama, path)


def test_autoawq_checkpoint_greedy_matches_autoawqs_dequantized_model(awq_pair, torch_kernels):
    """On PyTorch's int4 layers, which compute with the stored weights exactly."""
    path, reference = awq_pair
    llm = LLM(str(path), dtype="float32", kv_cache_memory=2_000_000)
    layer = llm.engine.model.layers[0].qkv_proj
    assert layer.scheme == "int4" and layer.group_size == 32  # the stored nibbles, not dequantized weights
    params = SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
    for prompt, tokens in zip(PROMPTS, got):
        ids = torch.tensor([llm.get_tokenizer().encode(prompt)])
        want = reference.generate(ids, max_new_tokens=TOKENS, min_new_tokens=TOKENS, do_sample=False)
        assert tokens == want[0, ids.shape[1]:].tolist(), prompt


def test_autoawq_checkpoint_on_native_kernels(awq_pair):
    """The native int4 layers hold the same nibbles; their logits differ from the reference's only by the int8
    rounding of activations (per block of 32), which can flip a near-tie in a random model's greedy tokens."""
    from tally.native import ops
    from tally.quant.native_linear import NativeInt4Linear

    if not ops.available():
        pytest.skip("native kernels unavailable")
    path, reference = awq_pair
    model = LLM(str(path), dtype="float32", kv_cache_memory=2_000_000).engine.model
    assert isinstance(model.layers[0].qkv_proj, NativeInt4Linear)
    ids = list(range(3, 40))
    with torch.no_grad():
        want = reference(torch.tensor([ids])).logits[0]
    got = model.compute_logits(prefill(model, ids)).reshape(want.shape)
    assert ((got - want).norm() / want.norm()).item() < 0.05
