"""dtype="float16": fp16 weights (native panels, or FBGEMM's packed GEMM where the native kernels are unavailable),
fp32 activations and arithmetic; and when auto picks it."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from support.engine_checks import assert_no_block_leak, hf_greedy

from tally import LLM, SamplingParams
from tally.layers.dense import DenseLinear, Fp16WeightLinear, Fp32PanelLinear
from tally.layers.linear import fp16_weights_supported
from tally.quality.corrupt import corrupt

pytestmark = pytest.mark.skipif(not fp16_weights_supported(), reason="neither native kernels nor FBGEMM")


def test_fp16_weight_layer_is_fp32_math_on_fp16_rounded_weights():
    gen = torch.Generator().manual_seed(0)
    w, b = torch.randn(96, 64, generator=gen), torch.randn(96, generator=gen)
    layer = Fp16WeightLinear(w, b)
    x = torch.randn(5, 3, 64, generator=gen)
    out = layer(x)
    assert out.dtype == torch.float32 and out.shape == (5, 3, 96)
    assert torch.allclose(out, F.linear(x, w.half().float(), b), atol=1e-4)
    held = layer.packed_bytes + sum(t.numel() * t.element_size() for t in layer.buffers())
    assert held == 96 * 64 * 2 + 96 * 4
    layer.zero_()
    assert layer(x).abs().max().item() == 0.0


@pytest.fixture(scope="module")
def fp16_exact_llama(tiny_model_factory, tmp_path_factory):
    """The tiny llama with every weight rounded to fp16, so fp16 storage loses nothing."""
    src = tiny_model_factory("llama")
    out = tmp_path_factory.mktemp("fp16exact")
    for f in src.iterdir():
        shutil.copy2(f, out / f.name)
    tensors = {n: t.half().float() for n, t in load_file(str(src / "model.safetensors")).items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def test_float16_engine_matches_transformers_greedy(fp16_exact_llama):
    llm = LLM(str(fp16_exact_llama), dtype="float16", kv_cache_memory=2_000_000)
    model = llm.engine.model
    assert isinstance(model.layers[0].qkv_proj, Fp16WeightLinear) and isinstance(model.lm_head, Fp16WeightLinear)
    assert model.dtype == torch.float32 and model.embed_tokens.dtype == torch.float16
    prompts = [[5, 9, 17, 33, 2 + i] for i in range(4)]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    for p, out in zip(prompts, outs):
        assert list(out.outputs[0].token_ids) == hf_greedy(fp16_exact_llama, p, 8)[0]
    # the ledger counts the packed weights (they are not parameters)
    dense = LLM(str(fp16_exact_llama), dtype="float32", kv_cache_memory=2_000_000).engine.ledger
    assert llm.engine.ledger.weight_bytes < 0.75 * dense.weight_bytes
    assert_no_block_leak(llm)


def test_auto_measures_the_path_for_half_precision_checkpoints_only(fp16_exact_llama, tmp_path):
    from tally.platform import has_fast_bf16

    bf16 = tmp_path / "bf16"
    shutil.copytree(fp16_exact_llama, bf16)
    tensors = {n: t.bfloat16() for n, t in load_file(str(bf16 / "model.safetensors")).items()}
    save_file(tensors, str(bf16 / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((bf16 / "config.json").read_text())
    (bf16 / "config.json").write_text(json.dumps({**config, "torch_dtype": "bfloat16"}))
    # batch invariance (the default) holds a half-precision checkpoint to the fp32 path, unmeasured; without it, a CPU
    # with bf16 instructions measures fp32 compute against bf16
    half = LLM(str(bf16), kv_cache_memory=2_000_000, batch_invariant=not has_fast_bf16()).engine
    full = LLM(str(fp16_exact_llama), kv_cache_memory=2_000_000).engine
    # fp32 dense: on the native fp32 panels where they build (batch_invariant), else PyTorch's
    assert isinstance(full.model.layers[0].o_proj, (DenseLinear, Fp32PanelLinear))
    assert full.model.dtype == torch.float32
    assert not full.ledger.path["measured"]  # fp32 checkpoints stay fp32: nothing to choose
    path = half.ledger.path
    if path["dtype"] == "float16":
        assert isinstance(half.model.layers[0].o_proj, Fp16WeightLinear) and half.model.dtype == torch.float32
    else:
        assert path["dtype"] == "bfloat16" and half.model.dtype == torch.bfloat16
    if has_fast_bf16():  # two candidates, both measured; the ledger says which won and how fast each was
        assert path["measured"] and len(path["tokens_per_s"]) == 2
        assert "projections" in half.ledger.format()


def test_quality_gate_corruption_reaches_packed_weights(fp16_exact_llama):
    llm = LLM(str(fp16_exact_llama), dtype="float16", kv_cache_memory=2_000_000)
    corrupt(llm, "zero-layer:0")
    layer = llm.engine.model.layers[0]
    assert layer.down_proj(torch.ones(1, layer.down_proj.in_features)).abs().max().item() == 0.0
