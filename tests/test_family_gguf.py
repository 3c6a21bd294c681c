"""Every family Tally reads, from the GGUF llama.cpp's own converter writes of a tiny random checkpoint
(tests/support/families.py): greedy tokens identical to transformers in fp32 with the weights dequantized; the
default path serving a q8_0 file's blocks as stored; the tokenizer and chat template read from the file; a file
missing one of the family's tensors, or of an architecture Tally does not read, refused by name. GPT-OSS's experts
also as the released files store them, MXFP4, read as transformers dequantizes the HF checkpoint's blocks."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import pytest
import torch
import transformers

from support.engine_checks import hf_greedy
from support.families import make_family_checkpoint, shared_family_checkpoint, shared_ggufs, to_gguf
from tally import LLM, SamplingParams
from tally.errors import ModelLoadError
from tally.models.gguf_header import read_header
from tally.models.loader import load_checkpoint

FAMILIES = ("llama3", "mistral", "gemma2", "gemma3", "phi3", "granite", "olmo2", "smollm3", "qwen3_moe", "mixtral",
            "olmoe", "gpt_oss")
# Traits no GGUF key carries, set as llama.cpp assumes them for the architecture (and as the released models'
# configs have them): the "llama" architecture Mistral is written as has no window (Mistral 7B v0.2+ has none);
# Gemma 2's scores scale by 1/sqrt(head_dim) (query_pre_attn_scalar = head_dim below 27B).
LLAMA_CPP_TRAITS = {"mistral": dict(sliding_window=None), "gemma2": dict(query_pre_attn_scalar=32)}
PROMPT = "The quick brown fox jumps over the lazy dog. Paris is"
GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
# Below Phi-3's original context of 64: the short LongRoPE factors, as transformers picks them at these lengths.
ENGINE = dict(max_model_len=64, kv_cache_memory=4_000_000)


@pytest.fixture(scope="module")
def files(tmp_path_factory, run_shared_dir) -> dict[str, Path]:
    """Each family's checkpoint directory (key: family) and its f32 and q8_0 GGUF (family-f32, family-q8_0), built
    once in the run for every test file that reads the same (tests/support/run_shared.py)."""
    out = {f: shared_family_checkpoint(run_shared_dir, f, **LLAMA_CPP_TRAITS.get(f, {})) for f in FAMILIES}
    out["gpt_oss-mxfp4-hf"], out["gpt_oss-dequantized"] = _mxfp4_experts(out["gpt_oss"],
                                                                        tmp_path_factory.mktemp("family-gguf"))
    jobs = {f"{f}-{t}": (out[f], t) for f in FAMILIES for t in ("f32", "q8_0")}
    jobs["gpt_oss-mxfp4"] = (out["gpt_oss-mxfp4-hf"], "f32")
    return out | dict(zip(jobs, shared_ggufs(run_shared_dir, list(jobs.values()))))


def _mxfp4_experts(hf_dir: Path, root: Path) -> tuple[Path, Path]:
    """GPT-OSS's checkpoint with its experts' projections as the released ones store them: MXFP4 blocks of 32
    (e2m1 values, two a byte, and an e8m0 scale: quantization_config mxfp4); and the same checkpoint with those
    blocks dequantized as transformers dequantizes them, the oracle."""
    from safetensors.torch import load_file, save_file
    from transformers.integrations.mxfp4 import FP4_VALUES, convert_moe_packed_tensors

    quantized, dequantized = root / "gpt_oss-mxfp4-hf", root / "gpt_oss-dequantized"
    shutil.copytree(hf_dir, quantized)
    shutil.copytree(hf_dir, dequantized)
    packed = load_file(hf_dir / "model.safetensors")
    dense = dict(packed)
    values = torch.tensor(FP4_VALUES)
    for name in [n for n in packed if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        rows = packed.pop(name).transpose(1, 2)  # [experts, out, in]: blocks run along the input
        rows = rows.reshape(*rows.shape[:2], -1, 32)
        exponent = torch.floor(torch.log2(rows.abs().amax(dim=-1))) - 2  # the largest value within e2m1's 6
        codes = ((rows / torch.exp2(exponent)[..., None])[..., None] - values).abs().argmin(dim=-1)  # nearest
        blocks = (codes[..., 0::2] | codes[..., 1::2] << 4).to(torch.uint8)
        scales = (exponent + 127).to(torch.uint8)
        packed |= {f"{name}_blocks": blocks, f"{name}_scales": scales}
        dense[name] = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    save_file(packed, quantized / "model.safetensors")
    save_file(dense, dequantized / "model.safetensors")
    config = json.loads((hf_dir / "config.json").read_text()) | {"quantization_config": {"quant_method": "mxfp4"}}
    (quantized / "config.json").write_text(json.dumps(config))
    return quantized, dequantized


def _greedy(llm: LLM, ids: list[int]) -> list[int]:
    return list(llm.generate([{"prompt_token_ids": ids}], GREEDY, use_tqdm=False)[0].outputs[0].token_ids)


@pytest.mark.parametrize("family", FAMILIES)
def test_gguf_of_each_family_gives_transformers_greedy_tokens_and_serves_its_blocks(files, family):
    hf_tok = transformers.AutoTokenizer.from_pretrained(files[family])
    ids = hf_tok.encode(PROMPT)
    expected = hf_greedy(files[family], ids, GREEDY.max_tokens)[0]

    dequantized = LLM(str(files[f"{family}-f32"]), quantization="none", dtype="float32", **ENGINE)
    assert _greedy(dequantized, ids) == expected
    tok = dequantized.get_tokenizer()
    assert tok.encode(PROMPT) == ids
    chat = hf_tok.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=False)
    assert tok.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=False) == chat
    if family != "phi3":  # Phi-3's GGUF tokenizer is Phi-3's own, which puts a space after each special token (as
        # llama.cpp does); this checkpoint's tokenizer.json is Llama's
        assert tok.encode(chat, add_special_tokens=False) == hf_tok.encode(chat, add_special_tokens=False)

    # q8_0 blocks as stored, int8 activations: near ties may part later, the first token may not
    stored = LLM(str(files[f"{family}-q8_0"]), **ENGINE)
    assert _greedy(stored, ids)[0] == expected[0]


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])  # experts saved per expert; fused, with layer types
def test_checkpoint_written_a_layer_at_a_time_is_whole_and_gives_transformers_greedy_tokens(tmp_path, family):
    """The large random checkpoints benchmarks/moe_decode.py builds a layer at a time in bf16: every weight
    transformers expects, each layer drawn anew, and the converter's GGUF of it read as transformers reads it."""
    hf_dir = make_family_checkpoint(tmp_path / family, family, by_layer=True, num_hidden_layers=3)
    model, info = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32,
                                                                    output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched weight
    first, last = (dict(model.model.layers[i].named_parameters()) for i in (0, 2))
    assert all(not torch.equal(first[name], last[name]) for name, p in first.items() if p.dim() > 1)
    ids = list(range(100, 116))
    llm = LLM(str(to_gguf(hf_dir, tmp_path / f"{family}.gguf")), quantization="none", dtype="float32", **ENGINE)
    assert _greedy(llm, ids) == hf_greedy(model, ids, GREEDY.max_tokens)[0]


def _renamed_copy(path: Path, out: Path, name: str) -> Path:
    """A copy of the GGUF at `path` whose tensor `name` is misspelt (its last letter changed): the file lacks it."""
    data = path.read_bytes()
    at = data.index(name.encode())
    out.write_bytes(data[:at + len(name) - 1] + b"X" + data[at + len(name):])
    return out


@pytest.mark.parametrize("family, tensor, message", [
    ("gemma2", "blk.1.post_ffw_norm.weight", r"missing 1 tensor\(s\) a gemma2 model .*"
                                             r"model\.layers\.1\.mlp_output_norm\.weight \(blk\.1\.post_ffw_norm"),
    ("phi3", "blk.0.attn_qkv.weight", r"missing 3 tensor\(s\) a phi3 model .*q_proj\.weight \(blk\.0\.attn_qkv"),
    ("mixtral", "blk.1.ffn_down_exps.weight", r"missing 4 tensor\(s\) a mixtral model .*"
                                              r"layers\.1\.mlp\.experts\.0\.down_proj\.weight \(blk\.1\.ffn_down_exps"),
])
def test_gguf_missing_a_family_tensor_is_refused_naming_it(files, tmp_path, family, tensor, message):
    broken = _renamed_copy(files[f"{family}-q8_0"], tmp_path / "broken.gguf", tensor)
    with pytest.raises(ModelLoadError, match=message):
        load_checkpoint(str(broken))


def test_gguf_rope_scaling_tally_does_not_read_is_refused_naming_the_key(files, tmp_path):
    data = files["gpt_oss-q8_0"].read_bytes()
    typed = (4).to_bytes(8, "little") + b"yarn"  # the value of gpt-oss.rope.scaling.type: its length, then the text
    assert data.count(typed) == 1
    (tmp_path / "xpos.gguf").write_bytes(data.replace(typed, (4).to_bytes(8, "little") + b"xpos"))
    with pytest.raises(ModelLoadError, match=r"gpt-oss model's rope scaling 'xpos' \(gpt-oss.rope.scaling.type\) is "
                                             r"not supported; Tally reads linear and yarn"):
        load_checkpoint(str(tmp_path / "xpos.gguf"))


def test_gguf_of_an_architecture_tally_does_not_read_names_those_it_reads(tmp_path):
    writer = gguf.GGUFWriter(tmp_path / "falcon.gguf", "falcon")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError, match=r"'falcon' model; Tally reads GGUF architectures gemma2, gemma3, "
                                             r"gpt-oss, granite, llama, mistral, olmo2, olmoe, phi3, qwen2, qwen3, "
                                             r"qwen3moe, smollm3$"):
        load_checkpoint(str(tmp_path / "falcon.gguf"))


def test_gpt_oss_mxfp4_experts_give_transformers_greedy_tokens_and_serve_as_table_blocks(files):
    # the converter repacks the HF checkpoint's MXFP4 blocks into GGML's MXFP4 as they are (no requantization)
    header = read_header(files["gpt_oss-mxfp4"])
    assert {t.name for t in header.tensors if t.ggml_type == gguf.GGMLQuantizationType.MXFP4} == {
        f"blk.{i}.ffn_{p}_exps.weight" for i in range(2) for p in ("gate", "up", "down")}
    ids = transformers.AutoTokenizer.from_pretrained(files["gpt_oss"]).encode(PROMPT)
    expected = hf_greedy(files["gpt_oss-dequantized"], ids, GREEDY.max_tokens)[0]
    assert expected != hf_greedy(files["gpt_oss"], ids, GREEDY.max_tokens)[0]  # the blocks round the experts
    dequantized = LLM(str(files["gpt_oss-mxfp4"]), quantization="none", dtype="float32", **ENGINE)
    assert _greedy(dequantized, ids) == expected
    # by default each expert's blocks are 4-bit indices into the doubled e2m1 table with block scales, exactly
    # (tally/quant/gguf_blocks.py), through the native experts call
    stored = LLM(str(files["gpt_oss-mxfp4"]), **ENGINE)
    experts = stored.engine.model.layers[0].experts
    assert {layer.scheme for layer in [*experts.gate_up, *experts.down]} == {"lut4"}
    assert experts.native() is not None
    assert _greedy(stored, ids)[0] == expected[0]
