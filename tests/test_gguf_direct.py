"""quantization="gguf": the built-in GGUF's Q4_1 / Q8_0 blocks serve as stored, and give the same model as the
dense dequantized weights."""
from __future__ import annotations

import pytest
import torch

from tally import LLM, SamplingParams
from tally.attention.backend import make_backend
from tally.errors import ConfigError
from tally.models.builder import build_model
from tally.models.loader import load_checkpoint
from tally.models.prefill import prefill
from tally.progress import untracked
from tally.quant.int4 import Int4Linear

pytestmark = pytest.mark.slow  # loads the built-in model (4 builds)

PROMPTS = ["The capital of France is", "def fibonacci(n):", "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"]


def built(ckpt, quantization):
    cfg = ckpt.config
    attn = make_backend("reference", num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                        scale=cfg.head_dim ** -0.5, sliding_window=None)
    return build_model(cfg, dict(ckpt.tensors()), dtype=torch.float32, quantization=quantization, attn=attn,
                       max_model_len=256, checkpoint=ckpt)


def test_gguf_blocks_as_stored_give_the_dequantized_models_logits(torch_kernels):
    ckpt = load_checkpoint(None)
    dense, direct = built(ckpt, None), built(ckpt, "gguf")
    assert isinstance(direct.layers[0].qkv_proj, Int4Linear)  # fused q/k/v rows, one Q4_1 layer
    assert isinstance(direct.layers[0].down_proj, Int4Linear)
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(str(ckpt.path.parent), gguf_file=ckpt.path.name,
                                                  local_files_only=True)
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        want = dense.compute_logits(prefill(dense, ids))
        got = direct.compute_logits(prefill(direct, ids))
        assert (got - want).abs().max().item() < 1e-4


def test_blocks_served_as_stored_are_never_read_as_floats():
    # Reading them would hold each dequantized (fp32: ~7x a 4-bit file) while the model is built
    ckpt = load_checkpoint(None)
    read: list[str] = []
    tensors = ckpt.tensor_map(untracked, lambda _: True, lambda name, t: read.append(name) or t)
    stored = {name: ckpt.gguf_tensor(name).ggml_type.name for name in tensors}
    cfg = ckpt.config
    attn = make_backend("reference", num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                        scale=cfg.head_dim ** -0.5, sliding_window=None)
    build_model(cfg, tensors, dtype=torch.float32, quantization="gguf", attn=attn, max_model_len=256, checkpoint=ckpt)
    assert not tensors  # every tensor taken
    assert {stored[name] for name in read} == {"F32"}  # the norms
    assert {"Q4_1", "Q8_0"} <= set(stored.values())


def test_gguf_direct_engine_greedy_tokens_equal_dense(torch_kernels):
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    outs = {}
    for q in ("none", "gguf"):  # dequantized, and as stored (the default)
        llm = LLM(None, dtype="float32", quantization=q, kv_cache_memory=16_000_000, max_model_len=256)
        outs[q] = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
    assert outs["gguf"] == outs["none"]


def test_gguf_quantization_on_a_safetensors_checkpoint_says_what_to_use(tiny_llama):
    with pytest.raises(ConfigError, match="not a GGUF file; use int8, int4 or w8a8"):
        LLM(str(tiny_llama), dtype="float32", quantization="gguf", kv_cache_memory=2_000_000)
