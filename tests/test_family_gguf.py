"""Every family Tally reads, from the GGUF llama.cpp's own converter writes of a tiny random checkpoint
(tests/support/families.py): greedy tokens identical to transformers in fp32 with the weights dequantized; the
default path serving a q8_0 file's blocks as stored; the tokenizer and chat template read from the file; a file
missing one of the family's tensors, or of an architecture Tally does not read, refused by name."""
from __future__ import annotations

from pathlib import Path

import gguf
import pytest
import transformers

from support.engine_checks import hf_greedy
from support.families import make_family_checkpoint, to_gguf_many
from tally import LLM, SamplingParams
from tally.errors import ModelLoadError
from tally.models.loader import load_checkpoint

FAMILIES = ("llama3", "mistral", "gemma2", "gemma3", "phi3", "granite", "olmo2", "smollm3", "qwen3_moe", "mixtral",
            "olmoe")
# Traits no GGUF key carries, set as llama.cpp assumes them for the architecture (and as the released models'
# configs have them): the "llama" architecture Mistral is written as has no window (Mistral 7B v0.2+ has none);
# Gemma 2's scores scale by 1/sqrt(head_dim) (query_pre_attn_scalar = head_dim below 27B).
LLAMA_CPP_TRAITS = {"mistral": dict(sliding_window=None), "gemma2": dict(query_pre_attn_scalar=32)}
PROMPT = "The quick brown fox jumps over the lazy dog. Paris is"
GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
# Below Phi-3's original context of 64: the short LongRoPE factors, as transformers picks them at these lengths.
ENGINE = dict(max_model_len=64, kv_cache_memory=4_000_000)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """Each family's checkpoint directory (key: family) and its f32 and q8_0 GGUF (family-f32, family-q8_0),
    converted in one converter process (its imports cost seconds)."""
    root = tmp_path_factory.mktemp("family-gguf")
    out = {f: make_family_checkpoint(root / f, f, **LLAMA_CPP_TRAITS.get(f, {})) for f in FAMILIES}
    jobs = [(out[f], root / f"{f}-{t}.gguf", t) for f in FAMILIES for t in ("f32", "q8_0")]
    return out | {path.stem: path for path in to_gguf_many(jobs)}


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


def test_gguf_of_an_architecture_tally_does_not_read_names_those_it_reads(tmp_path):
    # GPT-OSS: YaRN, attention sinks and a clamped SwiGLU the decoder does not compute
    writer = gguf.GGUFWriter(tmp_path / "gpt-oss.gguf", "gpt-oss")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError, match=r"'gpt-oss' model; Tally reads GGUF architectures gemma2, gemma3, "
                                             r"granite, llama, mistral, olmo2, olmoe, phi3, qwen2, qwen3, qwen3moe, "
                                             r"smollm3$"):
        load_checkpoint(str(tmp_path / "gpt-oss.gguf"))
