"""A `tally quantize` checkpoint round-trips: LLM(dir) loads the packed layers and computes what the in-memory
quantized model computes."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from tally import LLM, SamplingParams
from tally.errors import ConfigError, ModelLoadError
from tally.models.loader import load_checkpoint
from tally.models.packed_checkpoint import pack_int4, unpack_int4
from tally.models.prefill import prefill
from tally.native import ops as native_ops
from tally.quant.int4 import Int4Linear
from tally.quant.int8 import Int8Linear
from tally.quant.w8a8 import W8A8Linear
from tally.quantize.layer import QuantizeOptions
from tally.quantize.pipeline import QuantizeJob, fp_model, run
from tally.quantize.scheme import parse_scheme

PROMPTS = ["Paris is the capital of", "def add(a, b):"]


def in_memory_model(model_dir, layers):
    """The full-precision model with every quantized layer's dense equivalent swapped in."""
    ckpt = load_checkpoint(str(model_dir))
    weights = {n: t.float() for n, t in ckpt.tensors()}
    for layer in layers:
        weights |= layer.effective
    return fp_model(ckpt.config, weights, 256)


@pytest.mark.parametrize("arch, scheme, method, layer_type", [
    ("llama", "w4a16-g32", "gptq", Int4Linear),
    ("qwen2", "w4a16-g64", "awq", Int4Linear),  # AWQ folds into the v bias and the norms
    ("llama_tied_mqa", "w8a16", "rtn", Int8Linear),
])
def test_quantized_checkpoint_round_trips_to_the_in_memory_model(tiny_model_factory, calib_file, tmp_path, torch_kernels,
                                                                arch, scheme, method, layer_type):
    src = tiny_model_factory(arch)
    result = run(QuantizeJob(str(src), tmp_path / "q", QuantizeOptions(parse_scheme(scheme), method), calib=calib_file))
    llm = LLM(str(result.out), dtype="float32", kv_cache_memory=2_000_000)
    loaded = llm.engine.model
    assert isinstance(loaded.layers[1].gate_up_proj, layer_type)
    reference = in_memory_model(src, result.layers)
    tok = llm.get_tokenizer()
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    for prompt, out in zip(PROMPTS, llm.generate(PROMPTS, params)):
        ids = tok.encode(prompt, add_special_tokens=False)
        want = reference.compute_logits(prefill(reference, ids))
        assert (loaded.compute_logits(prefill(loaded, ids)) - want).abs().max().item() < 1e-4
        greedy = list(ids)
        for _ in range(6):
            greedy.append(int(reference.compute_logits(prefill(reference, greedy))[-1].argmax()))
        assert out.outputs[0].token_ids == greedy[len(ids):]


def test_w8a8_checkpoint_loads_the_stored_integers(tiny_llama, tmp_path):
    out = run(QuantizeJob(str(tiny_llama), tmp_path / "q", QuantizeOptions(parse_scheme("w8a8"), "rtn"))).out
    stored = load_file(str(out / "model.safetensors"))
    layer = LLM(str(out), dtype="float32", kv_cache_memory=2_000_000).engine.model.layers[0].o_proj
    assert layer.scheme == "w8a8"
    if isinstance(layer, W8A8Linear):
        held = layer.weight_int8
    else:  # NativeW8A8Linear: the same integers in the native kernel's tiles
        held = native_ops.q8_rows(layer.q, torch.arange(layer.out_features))
    assert torch.equal(held, stored["model.layers.0.self_attn.o_proj.qweight"])


def test_int4_nibble_packing_round_trips():
    q = torch.randint(0, 16, (8, 64), dtype=torch.uint8)
    assert pack_int4(q).shape == (8, 32) and torch.equal(unpack_int4(pack_int4(q)), q)


def test_quantized_checkpoint_refuses_a_second_quantization(tiny_llama, tmp_path):
    out = run(QuantizeJob(str(tiny_llama), tmp_path / "q", QuantizeOptions(parse_scheme("w8a16"), "rtn"))).out
    with pytest.raises(ConfigError, match="already quantized"):
        LLM(str(out), dtype="float32", quantization="int4", kv_cache_memory=2_000_000)


def test_damaged_packed_tensor_is_named(tiny_llama, tmp_path):
    out = run(QuantizeJob(str(tiny_llama), tmp_path / "q", QuantizeOptions(parse_scheme("w4a16-g32"), "rtn"))).out
    tensors = load_file(str(out / "model.safetensors"))
    name = "model.layers.1.mlp.down_proj.qweight"
    tensors[name] = tensors[name][:, :-1].contiguous()
    save_file(tensors, str(out / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="model.layers.1.mlp.down_proj"):
        load_checkpoint(str(out))


@pytest.mark.slow
def test_builtin_gguf_quantizes_to_a_checkpoint_that_serves(tmp_path):
    """GGUF source: config.json synthesised from the GGUF metadata, tokenizer written from it; SmolLM2's 576
    inputs take int4 group 64 under w4a16-g128."""
    out = run(QuantizeJob(None, tmp_path / "q", QuantizeOptions(parse_scheme("w4a16-g128"), "rtn"),
                          keep_high_precision="last")).out
    llm = LLM(str(out), dtype="float32", kv_cache_memory=16_000_000, max_model_len=256)
    layers = llm.engine.model.layers
    assert layers[0].qkv_proj.group_size == 64 and getattr(layers[-1].qkv_proj, "scheme", None) != "int4"
    reply = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                     SamplingParams(temperature=0, max_tokens=12))
    assert "Paris" in reply[0].outputs[0].text
