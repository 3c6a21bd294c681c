"""Checkpoints compressed-tensors writes (llm-compressor's format, tally/models/compressed_tensors.py) serve the
producer's weights: tiny models quantized here by compressed-tensors itself, held against transformers running the
weights compressed-tensors decompresses, in fp32."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from support.quantized_producers import compressed_tensors_reference, write_compressed_tensors

from tally import LLM, SamplingParams
from tally.errors import ModelLoadError
from tally.ledger.model_source import resolve_model
from tally.models.prefill import prefill

PROMPTS = ["Paris is the capital of", "def add(a, b):", "The quick brown fox"]
TOKENS = 8


@pytest.fixture(scope="module")
def produced(tiny_model_factory, tmp_path_factory):
    """(arch, preset) -> checkpoint directory, each written once for the module."""
    cache: dict[tuple[str, str], Path] = {}

    def get(arch: str, preset: str) -> Path:
        """preset: compressed-tensors' name, or "NAME:FORMAT" to store it in another format."""
        if (arch, preset) not in cache:
            out = tmp_path_factory.mktemp(f"ct-{arch}-{preset.replace(':', '-')}")
            name, _, storage = preset.partition(":")
            cache[arch, preset] = write_compressed_tensors(tiny_model_factory(arch), out, name, storage=storage or None)
        return cache[arch, preset]

    return get


def reference_tokens(path: Path, llm: LLM) -> list[list[int]]:
    model = compressed_tensors_reference(path)
    out = []
    for prompt in PROMPTS:
        ids = torch.tensor([llm.get_tokenizer().encode(prompt)])
        new = model.generate(ids, max_new_tokens=TOKENS, min_new_tokens=TOKENS, do_sample=False)
        out.append(new[0, ids.shape[1]:].tolist())
    return out


def tally_tokens(llm: LLM) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]


@pytest.mark.parametrize("arch, preset, layers", [
    ("llama", "W4A16", ("NativeInt4Linear", "Int4Linear")), ("qwen2", "W4A16_ASYM", ("NativeInt4Linear", "Int4Linear")),
    ("llama", "W8A16", ("NativeInt8Linear", "GroupInt8Linear")),
    ("llama", "W4A16_ASYM:naive-quantized", ("NativeInt4Linear", "Int4Linear")),
], ids=["llama-w4a16", "qwen2-w4a16-asym", "llama-w8a16-g32", "llama-w4a16-asym-naive"])
@pytest.mark.parametrize("kernels", ["native", "torch"])
def test_weight_only_checkpoint_greedy_matches_the_producers_dequantized_model(produced, monkeypatch, arch, preset,
                                                                              layers, kernels):
    """The stored integers load into int4 / int8 layers (Tally's native kernels, or PyTorch's with TALLY_NATIVE=0),
    and greedy tokens are the fp32 reference's (the native kernels round activations to int8 per block of 32, which
    meets no near-tie on these prompts; PyTorch's compute with the stored weights exactly)."""
    from tally.native import ops
    from tally.native.library import load

    if kernels == "torch":
        monkeypatch.setenv("TALLY_NATIVE", "0")
        load.cache_clear()
    elif not ops.available():
        pytest.skip("native kernels unavailable")
    layer = layers[kernels == "torch"]
    try:
        path = produced(arch, preset)
        llm = LLM(str(path), dtype="float32", kv_cache_memory=2_000_000)
        assert type(llm.engine.model.layers[0].qkv_proj).__name__ == layer
        assert tally_tokens(llm) == reference_tokens(path, llm)
    finally:
        monkeypatch.undo()
        load.cache_clear()


def test_w8a8_checkpoint_holds_the_producers_integers_and_rounds_activations_per_token(produced):
    """W8A8 int8: the weights read are exactly the producer's; activations are rounded to int8 per token at run time
    (as vLLM's kernels do), so logits stay within that rounding of the reference's, which does not round them."""
    from tally.models.loader import load_checkpoint
    from tally.quant.native_linear import NativeW8A8Linear
    from tally.quant.w8a8 import W8A8Linear

    path = produced("qwen2", "W8A8")
    reference = compressed_tensors_reference(path)
    stored = dict(load_checkpoint(str(path)).tensors())
    for name, module in reference.named_modules():
        if f"{name}.qweight" in stored:
            q, scale = stored[f"{name}.qweight"], stored[f"{name}.scales"]
            assert torch.equal(q.float() * scale[:, None], module.weight), name
    llm = LLM(str(path), dtype="float32", kv_cache_memory=2_000_000)
    model = llm.engine.model
    assert isinstance(model.layers[0].qkv_proj, (NativeW8A8Linear, W8A8Linear))
    ids = llm.get_tokenizer().encode("The quick brown fox jumps over the lazy dog.")
    with torch.no_grad():
        want = reference(torch.tensor([ids])).logits[0]
    got = model.compute_logits(prefill(model, ids)).reshape(want.shape)
    assert ((got - want).norm() / want.norm()).item() < 0.05
    assert torch.equal(got.argmax(-1), want.argmax(-1))


@pytest.mark.parametrize("field, value, message", [
    ("weights.type", "float", "weights.type is 'float'"),  # FP8 / NVFP4 weights
    ("weights.num_bits", 2, "weights.num_bits is 2"),
    ("weights.group_size", 48, "weights.group_size is 48"),
    ("input_activations", {"num_bits": 8, "type": "int", "strategy": "tensor", "dynamic": False, "symmetric": True},
     "input_activations.strategy is 'tensor'"),
    ("input_activations", {"num_bits": 8, "type": "int", "strategy": "token", "dynamic": False, "symmetric": True},
     "static activation scales"),
    ("format", "nvfp4-pack-quantized", "format is 'nvfp4-pack-quantized'"),
    ("sparsity_config", {"format": "sparse-24-bitmask", "sparsity_structure": "2:4"}, "sparsity_config"),
    ("kv_cache_scheme", {"num_bits": 8, "type": "float"}, "kv_cache_scheme"),
])
def test_unsupported_compressed_tensors_schemes_are_refused_by_field(produced, tmp_path, field, value, message):
    path = tmp_path / "ckpt"
    shutil.copytree(produced("llama", "W4A16"), path)
    config = json.loads((path / "config.json").read_text())
    block = config["quantization_config"]
    target = block if field in ("format", "sparsity_config", "kv_cache_scheme") else block["config_groups"]["group_0"]
    if field == "format":
        del block["config_groups"]["group_0"]["format"]
    *parents, leaf = field.split(".")
    for key in parents:
        target = target[key]
    target[leaf] = value
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=message):
        LLM(str(path), dtype="float32", kv_cache_memory=2_000_000)


def test_interleaved_group_index_is_served_dense_and_exact(produced, tmp_path, torch_kernels):
    """actorder "group" stores weight_g_idx; where it interleaves the groups over the inputs, the projection is
    the dense weight scale[g_idx] * q, exactly (int4 layers hold contiguous groups only)."""
    from safetensors.torch import load_file, save_file

    from tally.models.loader import load_checkpoint
    from tally.quant.base import QuantLinear

    path = tmp_path / "ckpt"
    shutil.copytree(produced("llama", "W4A16"), path)
    tensors = load_file(str(path / "model.safetensors"))
    name = "model.layers.0.mlp.down_proj"
    k = int(tensors[f"{name}.weight_shape"][1])
    g_idx = (torch.arange(k) // 32)[torch.randperm(k, generator=torch.Generator().manual_seed(0))]
    save_file(tensors | {f"{name}.weight_g_idx": g_idx.to(torch.int32)}, str(path / "model.safetensors"))
    stored = dict(load_checkpoint(str(path)).tensors())
    words = tensors[f"{name}.weight_packed"]
    q = ((words[..., None] >> torch.arange(0, 32, 4, dtype=torch.int32)) & 15).reshape(words.shape[0], -1) - 8
    assert torch.equal(stored[f"{name}.weight"], tensors[f"{name}.weight_scale"][:, g_idx] * q.float())
    model = LLM(str(path), dtype="float32", kv_cache_memory=2_000_000).engine.model
    assert not isinstance(model.layers[0].down_proj, QuantLinear)
    assert isinstance(model.layers[1].down_proj, QuantLinear)
    held = {t.name: t.stored_bytes for t in resolve_model(str(path)).tensors}
    assert held["layers.0.down_proj"] is None and held["layers.1.down_proj"] is not None  # `tally plan` prices it dense


@pytest.mark.parametrize("preset", ["W4A16_ASYM", "W8A8"])
def test_plan_prices_the_packed_projections_at_their_stored_bytes(produced, preset):
    """`tally plan` on a compressed-tensors checkpoint counts each projection's packed parts as the file holds them
    (the group index and shape are not held), not the dense weight."""
    from safetensors.torch import load_file

    path = produced("llama", preset)
    source = resolve_model(str(path))
    assert source.default_weights == "stored"
    name = "model.layers.1.self_attn.o_proj."
    want = sum(t.nbytes for n, t in load_file(str(path / "model.safetensors")).items()
               if n.startswith(name) and not n.endswith(("_shape", "g_idx")))
    held = {t.name: t for t in source.tensors}["layers.1.o_proj"]
    assert held.stored_bytes == want and want < 2 * held.numel  # not the dense weight
