"""GGUF files written here with gguf.GGUFWriter from the tiny HF checkpoints (q/k rows permuted the
way convert_hf_to_gguf does for llama), read back: the HF tensors come out, exactly for float types
and through the same rounding for quantized ones. Also: truncated and foreign files, and our
dequantization against transformers' independent implementation."""
from __future__ import annotations

import json
import math
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize
from safetensors.torch import load_file

from support.engine_checks import hf_greedy
from support.tiny_models import make_checkpoint
from tally import LLM, SamplingParams
from tally.attention.backend import make_backend
from tally.errors import ModelLoadError
from tally.models.builder import build_model
from tally.models.gguf_header import read_header
from tally.models.loader import load_checkpoint

_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
_LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
          "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
          "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
          "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
# One of each storage type the loader must read; vectors (norms, biases) stay F32 as in llama.cpp.
_TYPES = {"q_proj": Q.Q8_0, "k_proj": Q.Q4_1, "v_proj": Q.Q4_0, "o_proj": Q.F16, "gate_proj": Q.BF16,
          "up_proj": Q.Q8_0, "down_proj": Q.F32, "embed_tokens": Q.Q8_0, "lm_head": Q.F16}
GGUF_ARCH = {"llama": "llama", "llama_tied_mqa": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3"}


def gguf_name(hf: str) -> str:
    if hf in _GLOBAL:
        return _GLOBAL[hf]
    _, _, layer, rest = hf.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{_LAYER[module]}.{kind}"


def storage_type(hf: str, tensor: torch.Tensor) -> Q:
    return _TYPES[hf.split(".")[-2]] if tensor.dim() == 2 else Q.F32


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf's LlamaModel.permute."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def stored(tensor: np.ndarray, kind: Q) -> np.ndarray:
    if kind == Q.F32:
        return tensor.astype(np.float32)
    if kind == Q.F16:
        return tensor.astype(np.float16)
    return quantize(tensor.astype(np.float32), kind)


def write_gguf(hf_dir: Path, out: Path, arch: str, alignment: int | None = None,
               extra_tensors: dict[str, np.ndarray] | None = None, all_f32: bool = False,
               types: dict[str, Q] | None = None) -> Path:
    """`types`: storage types by HF module name (q_proj, ...) instead of _TYPES'."""
    cfg = json.loads((hf_dir / "config.json").read_text())
    tok = json.loads((hf_dir / "tokenizer.json").read_text())["model"]
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w = gguf.GGUFWriter(out, GGUF_ARCH[arch])
    if alignment:
        w.add_custom_alignment(alignment)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    if "head_dim" in cfg:  # qwen2's config leaves it out: the loader must fall back to hidden / heads
        w.add_key_length(cfg["head_dim"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(10000.0)
    if cfg.get("sliding_window") and arch == "mistral":
        w.add_sliding_window(cfg["sliding_window"])
    w.add_tokenizer_model("gpt2")
    w.add_token_list(sorted(tok["vocab"], key=tok["vocab"].get))
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in tok["merges"]])
    w.add_eos_token_id(2)
    for name, tensor in load_file(hf_dir / "model.safetensors").items():
        if name == "lm_head.weight" and cfg["tie_word_embeddings"]:
            continue
        values = tensor.numpy()
        if GGUF_ARCH[arch] in ("llama", "mistral") and ".q_proj." in name:
            values = permute(values, heads)
        if GGUF_ARCH[arch] in ("llama", "mistral") and ".k_proj." in name:
            values = permute(values, kv_heads)
        kind = Q.F32 if all_f32 or tensor.dim() != 2 else (_TYPES | (types or {}))[name.split(".")[-2]]
        w.add_tensor(gguf_name(name), stored(values, kind), raw_dtype=kind if kind not in (Q.F32, Q.F16) else None)
    for name, values in (extra_tensors or {}).items():
        w.add_tensor(name, values)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


@pytest.fixture(scope="module")
def tiny_gguf(tiny_model_factory, tmp_path_factory):
    cache: dict[str, Path] = {}

    def build(arch: str) -> Path:
        if arch not in cache:
            out = tmp_path_factory.mktemp(f"gguf-{arch}") / f"tiny-{arch}.gguf"
            cache[arch] = write_gguf(tiny_model_factory(arch), out, arch, alignment=64 if arch == "qwen2" else None)
        return cache[arch]

    return build


def expected_from_hf(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """The HF tensor through the storage type's rounding (row-wise, so row order does not matter)."""
    kind = storage_type(name, tensor)
    if kind == Q.F16:
        return tensor.half()
    if kind == Q.BF16:
        return tensor.bfloat16()
    if kind == Q.F32:
        return tensor
    return torch.from_numpy(dequantize(quantize(tensor.numpy(), kind), kind))


@pytest.mark.parametrize("arch", sorted(GGUF_ARCH))
def test_written_gguf_gives_back_the_hf_tensors_and_config(arch, tiny_model_factory, tiny_gguf):
    hf_dir = tiny_model_factory(arch)
    hf = load_checkpoint(str(hf_dir))
    ckpt = load_checkpoint(str(tiny_gguf(arch)))
    assert ckpt.format == "gguf" and ckpt.name == f"tiny-{arch}"
    assert ckpt.config == hf.config.__class__(**{**hf.config.__dict__, "architecture": GGUF_ARCH[arch],
                                                "torch_dtype": "float32", "rope_scaling": None})
    originals = dict(hf.tensors())
    loaded = dict(ckpt.tensors())
    assert loaded.keys() == originals.keys()
    for name, original in originals.items():
        expected = expected_from_hf(name, original)
        assert loaded[name].dtype == expected.dtype, name
        assert torch.equal(loaded[name], expected), name
        # and the rounding is what the storage type promises (catches a wrong row order too)
        step = original.abs().amax(dim=-1, keepdim=True) / 7 if original.dim() == 2 else 0.0
        assert torch.all((loaded[name].float() - original).abs() <= step + 1e-6), name


def test_raw_blocks_of_permuted_q_are_the_quantized_hf_rows(tiny_llama, tiny_gguf):
    ckpt = load_checkpoint(str(tiny_gguf("llama")))
    hf = load_file(tiny_llama / "model.safetensors")
    for name, kind in [("model.layers.1.self_attn.q_proj.weight", Q.Q8_0),
                       ("model.layers.1.self_attn.k_proj.weight", Q.Q4_1)]:
        raw = ckpt.gguf_tensor(name)
        assert raw.ggml_type == kind and raw.shape == tuple(hf[name].shape)
        assert raw.data.dtype == np.uint8
        np.testing.assert_array_equal(raw.data, quantize(hf[name].numpy(), kind))
    assert ckpt.gguf_tensor("lm_head.weight").ggml_type == Q.F16
    assert ckpt.gguf_tensor("model.layers.0.mlp.up_proj.bias") is None


def test_header_reader_agrees_with_gguf_reader(tiny_gguf):
    path = tiny_gguf("qwen2")
    ours, theirs = read_header(path), gguf.GGUFReader(path)
    for key, field in theirs.fields.items():
        if key.startswith("GGUF."):
            continue
        value = field.contents()
        counted = isinstance(value, list) and isinstance(value[0], str)
        assert ours.metadata[key] == (len(value) if counted else value), key
    assert [(t.name, t.ggml_type, t.shape, t.offset, t.nbytes) for t in ours.tensors] == [
        (t.name, t.tensor_type, tuple(reversed(t.shape.tolist())), t.data_offset, t.n_bytes) for t in theirs.tensors
    ]


@pytest.mark.parametrize("keep", ["header", "data"])
def test_truncated_gguf_raises_model_load_error(tiny_gguf, tmp_path, keep):
    data = tiny_gguf("llama").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:300] if keep == "header" else data[:-100])
    with pytest.raises(ModelLoadError, match="truncated"):
        load_checkpoint(str(cut))


def _llama3_divisors(head_dim: int, theta: float, s: dict) -> np.ndarray:
    """rope_freqs as llama.cpp's converter computes it from a Llama 3.1 config."""
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old = s["original_max_position_embeddings"]
    out = []
    for wavelen in 2 * math.pi / inv_freq:
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def test_llama3_rope_frequency_divisors_give_transformers_greedy_tokens(tmp_path):
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
    hf_dir = make_checkpoint(tmp_path / "llama3", "llama", rope_scaling=scaling)
    path = write_gguf(hf_dir, tmp_path / "llama3.gguf", "llama", all_f32=True,
                      extra_tensors={"rope_freqs.weight": _llama3_divisors(16, 10000.0, scaling)})
    assert load_checkpoint(str(path)).config.rope_scaling["rope_type"] == "divisors"
    prompt = [5, 17, 33, 2, 9, 40, 41, 42]
    llm = LLM(str(path), quantization="none", dtype="float32", max_model_len=128, kv_cache_memory=2_000_000)
    out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    assert list(out[0].outputs[0].token_ids) == hf_greedy(hf_dir, prompt, 12)[0]


def test_malformed_rope_frequency_divisors_are_refused(tiny_llama, tmp_path):
    path = write_gguf(tiny_llama, tmp_path / "llama3.gguf", "llama",
                      extra_tensors={"rope_freqs.weight": np.ones(5, dtype=np.float32)})
    with pytest.raises(ModelLoadError, match=r"rope_freqs\.weight should be 8 F32 values .* re-convert"):
        load_checkpoint(str(path))


def test_unknown_gguf_tensor_is_refused(tiny_llama, tmp_path):
    path = write_gguf(tiny_llama, tmp_path / "extra.gguf", "llama",
                      extra_tensors={"blk.0.ffn_up.bias": np.zeros(128, dtype=np.float32)})
    with pytest.raises(ModelLoadError, match=r"no place for \(blk\.0\.ffn_up\.bias\)"):
        load_checkpoint(str(path))


def test_file_that_is_not_gguf_is_refused(tmp_path):
    (tmp_path / "fake.gguf").write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        load_checkpoint(str(tmp_path / "fake.gguf"))


def test_unsupported_gguf_architecture_lists_supported(tmp_path):
    w = gguf.GGUFWriter(tmp_path / "g.gguf", "falcon")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelLoadError, match=r"'falcon' model; Tally reads GGUF architectures gemma2, gemma3, .*llama"):
        load_checkpoint(str(tmp_path / "g.gguf"))


def _random_blocks(kind: Q, count: int, half_offsets: list[int]) -> np.ndarray:
    """Random quant bytes with finite, modest fp16 scales where the format keeps them."""
    rng = np.random.default_rng(int(kind))
    blocks = rng.integers(0, 256, size=(count, gguf.GGML_QUANT_SIZES[kind][1]), dtype=np.uint8)
    for offset in half_offsets:
        scales = (rng.standard_normal(count) * 0.05).astype(np.float16)
        blocks[:, offset:offset + 2] = scales.view(np.uint8).reshape(count, 2)
    return blocks


@pytest.mark.parametrize("kind,half_offsets", [
    (Q.Q4_0, [0]), (Q.Q4_1, [0, 2]), (Q.Q8_0, [0]), (Q.Q4_K, [0, 2]), (Q.Q6_K, [208]),
])
def test_dequantize_matches_transformers(kind, half_offsets):
    from transformers.integrations.gguf.dequant import dequantize as hf_dequantize

    blocks = _random_blocks(kind, 64, half_offsets)
    ours = dequantize(blocks.reshape(4, -1), kind)
    theirs = hf_dequantize(torch.from_numpy(blocks.reshape(-1).copy()), int(kind)).reshape(4, -1)
    torch.testing.assert_close(torch.from_numpy(ours), theirs, rtol=1e-6, atol=1e-7)


def test_a_quantized_untied_embedding_is_looked_up_from_its_blocks(tiny_llama, tiny_gguf):
    """A GGUF's quantized token table serves the lookup as stored (Qwen2.5-0.5B's Q5_0 table: 102 MB instead of
    a 544 MB fp32 tensor), and gives the dequantized rows exactly."""
    ckpt = load_checkpoint(str(tiny_gguf("llama")))
    cfg = ckpt.config
    attn = make_backend("reference", num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                        scale=cfg.head_dim ** -0.5, sliding_window=None)
    model = build_model(cfg, dict(ckpt.tensors()), dtype=torch.float32, quantization="gguf", attn=attn,
                        max_model_len=64, checkpoint=ckpt)
    assert model.embed_tokens is None and model.embed_blocks is not None
    ids = torch.tensor([3, 0, cfg.vocab_size - 1])
    table = expected_from_hf("model.embed_tokens.weight", load_file(tiny_llama / "model.safetensors")[
        "model.embed_tokens.weight"])
    assert torch.equal(model.embed(ids), table[ids])


def test_q5_1_blocks_are_served_as_stored_without_a_warning(tiny_llama, tmp_path, caplog):
    """Q5_1 (5-bit values with minima) on the native 5-bit kernel; tests/test_gguf_block_types.py checks each such
    type's values against gguf's dequantizer."""
    path = write_gguf(tiny_llama, tmp_path / "q5_1.gguf", "llama",
                      types={"gate_proj": Q.Q5_1, "up_proj": Q.Q5_1, "down_proj": Q.Q5_1})
    prompt = [{"prompt_token_ids": [5, 17, 33, 2]}]
    greedy = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    with caplog.at_level("WARNING", logger="tally.models.gguf_checkpoint"):
        llm = LLM(str(path), dtype="float32", max_model_len=64, kv_cache_memory=2_000_000)
        served = llm.generate(prompt, greedy)
    assert not [r for r in caplog.records if "no native kernel" in r.getMessage()]
    assert llm.engine.model.layers[0].gate_up_proj.bits == 5
    plain = LLM(str(path), quantization="none", dtype="float32", max_model_len=64, kv_cache_memory=2_000_000)
    assert served[0].outputs[0].token_ids[0] == plain.generate(prompt, greedy)[0].outputs[0].token_ids[0]
