"""Hugging Face checkpoints: every tiny arch loads, tensors are the file's, shards work, and each
way a checkpoint can be broken gives a ModelLoadError that names the file or tensor."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tally.errors import ModelLoadError
from tally.models.loader import load_checkpoint
from tally.models.tokenizer import load_tokenizer, stop_token_ids


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_every_arch_loads_with_tensors_equal_to_the_safetensors(tiny_any_arch):
    ckpt = load_checkpoint(str(tiny_any_arch))
    on_disk = load_file(tiny_any_arch / "model.safetensors")
    loaded = dict(ckpt.tensors())
    if ckpt.config.tie_word_embeddings:
        on_disk.pop("lm_head.weight", None)
    assert ckpt.format == "hf" and ckpt.path == tiny_any_arch and ckpt.name == tiny_any_arch.name
    assert loaded.keys() == on_disk.keys()
    for name, tensor in on_disk.items():
        assert loaded[name].dtype == tensor.dtype
        assert torch.equal(loaded[name], tensor), name
    assert ckpt.gguf_tensor("model.embed_tokens.weight") is None


def test_config_reflects_each_arch(tiny_model_factory):
    qwen2 = load_checkpoint(str(tiny_model_factory("qwen2"))).config
    qwen3 = load_checkpoint(str(tiny_model_factory("qwen3"))).config
    mistral = load_checkpoint(str(tiny_model_factory("mistral"))).config
    assert qwen2.attention_bias and qwen2.tie_word_embeddings
    assert qwen3.qk_norm and qwen3.head_dim == 16
    assert mistral.sliding_window == 12 and not mistral.tie_word_embeddings


def test_sharded_checkpoint_loads_the_same_tensors(tiny_llama, tmp_path):
    sharded = _copy(tiny_llama, tmp_path / "sharded")
    tensors = load_file(sharded / "model.safetensors")
    (sharded / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, shard_names in shards.items():
        save_file({n: tensors[n] for n in shard_names}, sharded / file)
    weight_map = {n: file for file, shard_names in shards.items() for n in shard_names}
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))

    loaded = dict(load_checkpoint(str(sharded)).tensors())
    assert loaded.keys() == tensors.keys()
    assert all(torch.equal(loaded[n], tensors[n]) for n in names)


def test_missing_shard_is_named(tiny_llama, tmp_path):
    broken = _copy(tiny_llama, tmp_path / "broken")
    (broken / "model.safetensors").rename(broken / "model-00001-of-00002.safetensors")
    names = load_file(broken / "model-00001-of-00002.safetensors").keys()
    weight_map = {n: "model-00001-of-00002.safetensors" for n in names}
    weight_map["model.norm.weight"] = "model-00002-of-00002.safetensors"
    (broken / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(ModelLoadError, match="model-00002-of-00002.safetensors"):
        load_checkpoint(str(broken))


def test_generation_config_eos_ids_are_merged_into_the_config(tiny_llama, tmp_path):
    ckpt_dir = _copy(tiny_llama, tmp_path / "chat")
    (ckpt_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    ckpt = load_checkpoint(str(ckpt_dir))
    assert ckpt.config.eos_token_ids == (2, 0)
    assert set(stop_token_ids(load_tokenizer(ckpt), ckpt.config)) == {0, 2}


def test_tokenizer_has_chat_template_and_im_end_stops(tiny_llama):
    ckpt = load_checkpoint(str(tiny_llama))
    tok = load_tokenizer(ckpt)
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(tok("café 🙂 def add(a, b)").input_ids) == "café 🙂 def add(a, b)"
    assert stop_token_ids(tok, ckpt.config) == (tok.convert_tokens_to_ids("<|im_end|>"),)


def test_checkpoint_without_tokenizer_json_says_what_to_copy(tiny_llama, tmp_path):
    ckpt_dir = _copy(tiny_llama, tmp_path / "notok")
    (ckpt_dir / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match="has no tokenizer.json; copy tokenizer.json"):
        load_tokenizer(load_checkpoint(str(ckpt_dir)))


@pytest.mark.parametrize("keep_bytes", [0, 7, 100, -1000])
def test_truncated_safetensors_names_the_file(tiny_llama, tmp_path, keep_bytes):
    broken = _copy(tiny_llama, tmp_path / "truncated")
    data = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[:keep_bytes])
    with pytest.raises(ModelLoadError, match=r"model\.safetensors is corrupt or truncated"):
        load_checkpoint(str(broken))


def test_garbage_safetensors_header_names_the_file(tiny_llama, tmp_path):
    broken = _copy(tiny_llama, tmp_path / "garbage")
    data = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[:8] + b"{" * (len(data) - 8))
    with pytest.raises(ModelLoadError, match=r"model\.safetensors is corrupt"):
        load_checkpoint(str(broken))


def test_missing_tensor_is_named(tiny_llama, tmp_path):
    broken = _copy(tiny_llama, tmp_path / "missing")
    tensors = load_file(broken / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, broken / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"missing 1 tensor.*model\.layers\.1\.mlp\.up_proj\.weight"):
        load_checkpoint(str(broken))


def test_shape_mismatch_with_config_names_tensor_and_shapes(tiny_llama, tmp_path):
    broken = _copy(tiny_llama, tmp_path / "mismatch")
    config = json.loads((broken / "config.json").read_text())
    config["intermediate_size"] = 96
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"gate_proj\.weight has shape \[128, 64\] but the config implies \[96, 64\]"):
        load_checkpoint(str(broken))


def test_tensors_the_model_cannot_use_are_refused(tiny_llama, tmp_path):
    broken = _copy(tiny_llama, tmp_path / "extra")
    tensors = load_file(broken / "model.safetensors")
    tensors["model.layers.0.mlp.up_proj.bias"] = torch.zeros(128)
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)  # harmless: ignored
    save_file(tensors, broken / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"1 tensor\(s\).*no place for \(model\.layers\.0\.mlp\.up_proj\.bias\)"):
        load_checkpoint(str(broken))


def test_integer_tensors_are_refused(tiny_llama, tmp_path):
    broken = _copy(tiny_llama, tmp_path / "int8")
    tensors = load_file(broken / "model.safetensors")
    tensors["model.norm.weight"] = tensors["model.norm.weight"].to(torch.int8)
    save_file(tensors, broken / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"model\.norm\.weight is stored as I8"):
        load_checkpoint(str(broken))


def test_unknown_architecture_lists_supported_ones(tiny_llama, tmp_path):
    broken = _copy(tiny_llama, tmp_path / "gpt2")
    config = json.loads((broken / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"'GPT2LMHeadModel'.*LlamaForCausalLM"):
        load_checkpoint(str(broken))


def test_directory_without_weights_says_what_it_lacks(tiny_llama, tmp_path):
    broken = _copy(tiny_llama, tmp_path / "noweights")
    (broken / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"neither model\.safetensors nor model\.safetensors\.index\.json"):
        load_checkpoint(str(broken))
