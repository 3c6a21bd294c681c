"""Every family Tally reads, as a tiny random checkpoint from transformers' own config class with the traits that trip
loaders: greedy tokens identical to transformers in fp32, alone, batched, in prefill chunks and from the prefix cache;
the parameter count the ledger plans with equals transformers'; what Tally cannot read fails at load, by name."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import safetensors.torch
import torch

from support.engine_checks import hf_greedy
from support.families import FAMILIES, make_family_checkpoint
from tally import LLM, SamplingParams
from tally.errors import ModelLoadError
from tally.models.families import read_hf_config
from tally.models.native_traits import layer_unsupported
from tally.native import ops as native

NAMES = sorted(FAMILIES)
# a mixture-of-experts model with a dense layer among its expert layers; YaRN (rounded correction range, attention
# factor from `factor`) on Llama's layer, as Qwen2.5's long-context configs have it, on the native paths; Ministral
VARIANTS = {"qwen3_moe_dense_layer": ("qwen3_moe", dict(num_hidden_layers=3, mlp_only_layers=[1])),
            "mistral_yarn": ("mistral", dict(rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                                                   original_max_position_embeddings=64))),
            # Ministral: Mistral's layer, a sliding layer then a full one (transformers' own MinistralConfig)
            "ministral": ("mistral", dict(model_type="ministral", architectures=["MinistralForCausalLM"],
                                          layer_types=["sliding_attention", "full_attention"]))}
PROMPTS = [[5, 17, 33, 2, 9, 40], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]]
GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def family_dir(tmp_path_factory):
    cache: dict[str, Path] = {}

    def build(name: str) -> Path:
        if name not in cache:
            family, overrides = VARIANTS.get(name, (name, {}))
            cache[name] = make_family_checkpoint(tmp_path_factory.mktemp(name), family, **overrides)
        return cache[name]
    return build


def _tokens(outputs) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outputs]


@pytest.mark.parametrize("name", NAMES + sorted(VARIANTS))
def test_family_greedy_matches_transformers_alone_batched_chunked_and_cached(name, family_dir):
    model_dir = family_dir(name)
    expected = [hf_greedy(model_dir, p, GREEDY.max_tokens)[0] for p in PROMPTS]
    max_len = 64 if name == "phi3" else 128  # Phi-3's short factors: within its original context
    llm = LLM(str(model_dir), dtype="float32", max_model_len=max_len, kv_cache_memory=4_000_000)
    # the fused native layers compute every family's traits (where the kernels load)
    assert all(layer.native for layer in llm.engine.model.layers) or not native.available()
    assert _tokens(llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY)) == expected
    assert _tokens(llm.generate([{"prompt_token_ids": PROMPTS[1]}], GREEDY)) == expected[1:]  # a prefix-cache hit
    chunked = LLM(str(model_dir), dtype="float32", max_model_len=max_len, kv_cache_memory=4_000_000,
                  max_num_batched_tokens=5, enable_prefix_caching=False)
    assert _tokens(chunked.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY)) == expected


# a family -> a multimodal model_type whose text part it is (Gemma 3 4B and up; Mistral Small 3.1 and 3.2)
MULTIMODAL = {"gemma3": "gemma3", "mistral": "mistral3"}


@pytest.mark.parametrize("name", sorted(MULTIMODAL))
def test_a_multimodal_checkpoint_serves_its_text_model_as_transformers_does(name, tmp_path, caplog):
    hub = make_family_checkpoint(tmp_path / "hub", name, wrapper=MULTIMODAL[name])
    expected = [hf_greedy(hub, p, GREEDY.max_tokens)[0] for p in PROMPTS]
    # the same tensors under transformers 5's names for them (model.language_model.*) read the same
    renamed = tmp_path / "v5"
    shutil.copytree(hub, renamed)
    tensors = safetensors.torch.load_file(hub / "model.safetensors")
    safetensors.torch.save_file({re.sub(r"^language_model\.model\.", "model.language_model.", k): v
                                 for k, v in tensors.items()}, renamed / "model.safetensors")
    for model_dir in (hub, renamed):
        caplog.clear()
        llm = LLM(str(model_dir), dtype="float32", max_model_len=128, kv_cache_memory=4_000_000)
        assert "leaves the" in caplog.text and "tensors of its vision side unread" in caplog.text
        assert _tokens(llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY)) == expected


def test_phi3_long_factors_past_the_original_context_match_transformers(family_dir):
    # transformers rotates with the long factors once a sequence passes the original context (64); Tally whenever
    # max_model_len does: they agree on a prompt longer than 64
    model_dir = family_dir("phi3")
    prompt = list(range(3, 75))
    llm = LLM(str(model_dir), dtype="float32", max_model_len=128, kv_cache_memory=4_000_000)
    assert _tokens(llm.generate([{"prompt_token_ids": prompt}], GREEDY)) == [hf_greedy(model_dir, prompt, 10)[0]]


@pytest.mark.parametrize("name", NAMES)
def test_parameter_count_equals_transformers(name, family_dir):
    import transformers

    model_dir = family_dir(name)
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    assert read_hf_config(model_dir / "config.json").num_parameters() == sum(p.numel() for p in hf.parameters())


def _edit_config(model_dir: Path, tmp_path: Path, **changes) -> Path:
    out = tmp_path / "edited"
    out.mkdir()
    for f in model_dir.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((model_dir / "config.json").read_text()) | changes
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def test_unknown_architecture_names_it_and_what_tally_reads(tiny_llama, tmp_path):
    edited = _edit_config(tiny_llama, tmp_path, architectures=["FalconForCausalLM"])
    with pytest.raises(ModelLoadError, match=r"unsupported architecture 'FalconForCausalLM'; Tally reads .*"
                                             r"Gemma2ForCausalLM.*Phi3ForCausalLM"):
        LLM(str(edited))


@pytest.mark.parametrize("field, value, message", [
    ("rope_scaling", {"rope_type": "dynamic", "factor": 4.0}, r"llama model's rope scaling 'dynamic' .* supports "
                                                              r"linear, llama3, longrope, yarn"),
    ("hidden_act", "relu", r"llama model's activation 'relu' .* supports silu"),
])
def test_unsupported_trait_fails_at_load_naming_family_field_and_value(tiny_llama, tmp_path, field, value, message):
    edited = _edit_config(tiny_llama, tmp_path, **{field: value})
    with pytest.raises(ModelLoadError, match=message):
        LLM(str(edited))


def test_missing_family_tensor_is_named(family_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    model_dir = family_dir("gemma2")
    edited = _edit_config(model_dir, tmp_path)
    tensors = load_file(edited / "model.safetensors")
    del tensors["model.layers.1.post_feedforward_layernorm.weight"]
    save_file(tensors, edited / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"missing 1 tensor\(s\) a gemma2 model .*layers.1.mlp_output_norm"):
        LLM(str(edited))


def test_traits_read_from_the_config(family_dir):
    gemma3 = read_hf_config(family_dir("gemma3") / "config.json")
    assert gemma3.layer_window == (8, 8, 8, 8, 8, None) and gemma3.uniform_sliding_window is None
    assert (gemma3.rope_theta, gemma3.rope_theta_sliding) == (1000000.0, 10000.0)
    moe = read_hf_config(family_dir("qwen3_moe_dense_layer") / "config.json")
    assert [moe.is_moe_layer(i) for i in range(3)] == [True, False, True]
    assert read_hf_config(family_dir("smollm3") / "config.json").nope_layers == (3,)


def test_traits_read_from_a_config_in_the_older_style(family_dir, tmp_path):
    # most published checkpoints predate transformers 5: rope_theta and rope_scaling, not rope_parameters
    cfg = json.loads((family_dir("llama3") / "config.json").read_text())
    params = cfg.pop("rope_parameters")
    cfg |= {"rope_theta": params.pop("rope_theta"), "rope_scaling": params}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert read_hf_config(tmp_path / "config.json") == read_hf_config(family_dir("llama3") / "config.json")


@pytest.mark.parametrize("field, value, message", [
    ("rope_parameters", {"rope_type": "dynamic", "rope_theta": 150000.0, "factor": 4.0},
     r"gpt_oss model's rope scaling 'dynamic' \(config.json rope_scaling\)"),
    ("layer_types", ["sliding_attention", "chunked_attention"], r"layer_types has 'chunked_attention'; Tally "
                                                                 r"supports 'sliding_attention' and 'full_attention'"),
    # the released checkpoints' MXFP4 experts: their GGUF serves them
    ("quantization_config", {"quant_method": "mxfp4"}, r"config.json has a quantization_config Tally does not read "
                                                        r"\('mxfp4'\)"),
])
def test_gpt_oss_trait_tally_cannot_read_fails_at_load_naming_it(family_dir, tmp_path, field, value, message):
    edited = _edit_config(family_dir("gpt_oss"), tmp_path, **{field: value})
    with pytest.raises(ModelLoadError, match=message):
        LLM(str(edited))


def test_gpt_oss_traits_and_paths(family_dir):
    # the fused native layers and the one-call step compute its sinks, biases and clamped experts; its attention
    # backends carry each layer's own sinks, and its YaRN scales cos and sin by transformers' attention factor
    import math

    cfg = read_hf_config(family_dir("gpt_oss") / "config.json")
    assert cfg.layer_window == (8, None) and cfg.attention_sinks and cfg.attention_output_bias
    assert not layer_unsupported(cfg)  # the native fused paths' gate: tally/models/native_traits.py
    assert (cfg.activation, cfg.experts.routing, cfg.experts.bias) == ("clamped_swiglu", "top_k_softmax", True)
    llm = LLM(str(family_dir("gpt_oss")), dtype="float32", max_model_len=64, kv_cache_memory=4_000_000)
    model = llm.engine.model
    layers = model.layers
    assert all(layer.native for layer in layers) or not native.available()
    assert [len(layer.attn.config.sinks) for layer in layers] == [4, 4]
    assert layers[0].attn.config.sinks != layers[1].attn.config.sinks
    assert model.rotary.cos[0, 0].item() == pytest.approx(0.1 * math.log(4.0) + 1)


@pytest.mark.parametrize("name", ["mixtral", "gpt_oss"])  # GPT-OSS: with the experts' biases and the sinks
def test_ledger_counts_every_expert_in_memory_and_the_routed_ones_per_token(family_dir, name):
    from tally.ledger.weights import WeightFormat, matmul_params, model_tensors

    cfg = read_hf_config(family_dir(name) / "config.json")
    tensors = model_tensors(cfg)
    assert sum(t.numel for t in tensors) == cfg.num_parameters()
    e, h = cfg.experts, cfg.hidden_size
    unrouted = cfg.num_layers * (e.num_experts - e.top_k) * 3 * h * e.intermediate_size
    assert matmul_params(tensors, cfg) == sum(t.numel for t in tensors if t.role in ("linear", "lm_head")) - unrouted
    fmt = WeightFormat("dense", "float32")
    assert sum(fmt.tensor_bytes(t) for t in tensors) == 4 * cfg.num_parameters()


@pytest.mark.parametrize("name", ["olmo2", "phi3"])
def test_int8_kv_cache_smooths_keys_through_projection_norms_and_partial_rotary(name, family_dir):
    # key smoothing measures k after the family's q/k norm and keeps each rotary pair's scale equal
    model_dir = family_dir(name)
    llm = LLM(str(model_dir), dtype="float32", max_model_len=64, kv_cache_memory=4_000_000, kv_cache_dtype="int8")
    first = _tokens(llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY))
    assert [t[0] for t in first] == [hf_greedy(model_dir, p, 1)[0][0] for p in PROMPTS]
