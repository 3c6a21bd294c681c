"""The tiny family checkpoints of tests/support/families.py: each loads in transformers with its tokenizer and
generates, and llama.cpp's own converter turns each into a GGUF whose header carries the family's traits where a
reader finds them (GGUF_TRAITS), and leaves out the ones llama.cpp assumes per architecture (LLAMA_CPP_ASSUMES)."""
from __future__ import annotations

import math

import gguf
import pytest
import transformers

from support.engine_checks import hf_greedy
from support.families import FAMILIES, read_gguf_header, shared_family_checkpoint, shared_ggufs

PROMPT = "The quick brown fox jumps over the lazy dog. Paris is the capital of France."

# Family -> (general.architecture, metadata the traits are stored in with the values the config gives them,
# tensors beyond a plain decoder's, as blk.0.* for per-layer ones).
GGUF_TRAITS: dict[str, tuple[str, dict[str, object], list[str]]] = {
    "llama3": ("llama", {"llama.rope.freq_base": 500000.0, "llama.context_length": 2048}, ["rope_freqs.weight"]),
    "gemma2": ("gemma2", {"gemma2.attn_logit_softcapping": 5.0, "gemma2.final_logit_softcapping": 30.0,
                          "gemma2.attention.sliding_window": 8, "gemma2.attention.key_length": 32},
               ["blk.0.post_attention_norm.weight", "blk.0.post_ffw_norm.weight"]),
    "gemma3": ("gemma3", {"gemma3.rope.freq_base": 1000000.0, "gemma3.rope.freq_base_swa": 10000.0,
                          "gemma3.attention.sliding_window": 8, "gemma3.attention.key_length": 32},
               ["blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight", "blk.0.post_ffw_norm.weight"]),
    "phi3": ("phi3", {"phi3.rope.dimension_count": 12, "phi3.context_length": 256,
                      "phi3.rope.scaling.original_context_length": 64,
                      "phi3.rope.scaling.attn_factor": math.sqrt(1 + math.log(4) / math.log(64))},
             ["rope_factors_long.weight", "rope_factors_short.weight", "blk.0.attn_qkv.weight"]),
    "granite": ("granite", {"granite.attention.scale": 0.4, "granite.embedding_scale": 2.0,
                            "granite.residual_scale": 0.7, "granite.logit_scale": 1.25}, []),
    "olmo2": ("olmo2", {"olmo2.attention.layer_norm_rms_epsilon": 1e-5},
              ["blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight", "blk.0.post_attention_norm.weight",
               "blk.0.post_ffw_norm.weight"]),
    "smollm3": ("smollm3", {"smollm3.block_count": 4, "smollm3.rope.freq_base": 2000000.0}, []),
    "mistral": ("llama", {"llama.attention.key_length": 16}, []),
    "qwen3_moe": ("qwen3moe", {"qwen3moe.expert_count": 8, "qwen3moe.expert_used_count": 2,
                               "qwen3moe.expert_feed_forward_length": 32},
                  ["blk.0.ffn_gate_inp.weight", "blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight",
                   "blk.0.ffn_down_exps.weight", "blk.0.attn_q_norm.weight"]),
    "mixtral": ("llama", {"llama.expert_count": 4, "llama.expert_used_count": 2},
                ["blk.0.ffn_gate_inp.weight", "blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight",
                 "blk.0.ffn_down_exps.weight"]),
    "olmoe": ("olmoe", {"olmoe.expert_count": 8, "olmoe.expert_used_count": 2},
              ["blk.0.ffn_gate_inp.weight", "blk.0.ffn_gate_exps.weight", "blk.0.attn_q_norm.weight"]),
    "gpt_oss": ("gpt-oss", {"gpt-oss.attention.sliding_window": 8, "gpt-oss.rope.scaling.type": "yarn",
                            "gpt-oss.rope.scaling.factor": 4.0, "gpt-oss.rope.scaling.original_context_length": 64,
                            "gpt-oss.rope.scaling.yarn_beta_fast": 32.0, "gpt-oss.rope.scaling.yarn_beta_slow": 1.0,
                            "gpt-oss.expert_count": 4, "gpt-oss.expert_used_count": 2,
                            "gpt-oss.expert_feed_forward_length": 64},
                ["blk.0.attn_sinks.weight", "blk.0.attn_q.bias", "blk.0.ffn_gate_inp.bias",
                 "blk.0.ffn_gate_exps.bias", "blk.0.ffn_down_exps.bias", "blk.0.post_attention_norm.weight"]),
}

# Traits of the checkpoints that no GGUF key states: llama.cpp fixes them per architecture (src/models/*.cpp), so a
# reader must too. Family -> {absent key: what llama.cpp assumes}.
LLAMA_CPP_ASSUMES: dict[str, dict[str, str]] = {
    "gemma2": {"gemma2.attention.sliding_window_pattern": "layers 0, 2, 4, ... slide; the rest are global",
               "gemma2.attention.scale": "1/sqrt(head_dim), 1/sqrt(hidden/heads) at 46 layers (27B); "
                                         "config's query_pre_attn_scalar is not read"},
    "gemma3": {"gemma3.attention.sliding_window_pattern": "every 6th layer global, the rest slide",
               "gemma3.attention.scale": "1/sqrt(head_dim), 1/sqrt(hidden/heads) at 62 layers (27B)"},
    "smollm3": {"smollm3.attention.rope_pattern": "every 4th layer (3, 7, ...) without RoPE"},
    "mistral": {"llama.attention.sliding_window": "none: the llama architecture attends to the whole context"},
    "mixtral": {"llama.expert_weights_norm": "top-k weights renormalised"},
    "qwen3_moe": {"qwen3moe.expert_weights_norm": "top-k weights renormalised (norm_topk_prob true)"},
    "olmoe": {"olmoe.expert_weights_norm": "top-k weights not renormalised (norm_topk_prob false)"},
    "gpt_oss": {"gpt-oss.attention.sliding_window_pattern": "layers 0, 2, 4, ... slide; the rest are global",
                "gpt-oss.swiglu_clamp_exp": "SwiGLU with alpha 1.702, gate and up clamped at 7.0"},
}

# q8_0 only where the vocabulary is small: converting a 49,152-token BPE again costs ~2 s of CPU for nothing new.
OUTTYPES = {family: ("f32",) if spec.tokenizer == "smollm2" else ("f32", "q8_0") for family, spec in FAMILIES.items()}


@pytest.fixture(scope="module")
def checkpoints(run_shared_dir):
    return {family: shared_family_checkpoint(run_shared_dir, family) for family in FAMILIES}


@pytest.fixture(scope="module")
def ggufs(checkpoints, run_shared_dir):
    """Every family in every outtype, converted once in the run for every test file that reads the same
    (tests/support/run_shared.py)."""
    pairs = [(family, outtype) for family in FAMILIES for outtype in OUTTYPES[family]]
    return dict(zip(pairs, shared_ggufs(run_shared_dir, [(checkpoints[f], t) for f, t in pairs])))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_loads_in_transformers_and_generates_varied_tokens(checkpoints, family):
    tok = transformers.AutoTokenizer.from_pretrained(checkpoints[family])
    ids = tok.encode(PROMPT)
    assert tok.decode(ids, skip_special_tokens=True).strip() == PROMPT
    tokens, logprobs = hf_greedy(checkpoints[family], ids, 8)
    config = transformers.AutoConfig.from_pretrained(checkpoints[family])
    assert all(0 <= t < config.vocab_size for t in tokens)
    assert len(set(tokens)) > 1, "the output echoes one token: the weights drown the input"
    assert all(math.isfinite(lp) for lp in logprobs)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_converts_to_gguf_with_its_traits_in_the_header(ggufs, family):
    arch, keys, tensors = GGUF_TRAITS[family]
    for outtype in OUTTYPES[family]:
        header = read_gguf_header(ggufs[family, outtype])
        assert header.metadata["general.architecture"] == arch
        for key, value in keys.items():
            assert header.metadata.get(key) == (pytest.approx(value) if isinstance(value, float) else value), key
        assert set(tensors) <= set(header.tensors)
        assert not set(LLAMA_CPP_ASSUMES.get(family, {})) & set(header.metadata)
        quantized = {name for name, (kind, _) in header.tensors.items() if kind == gguf.GGMLQuantizationType.Q8_0}
        assert ("blk.0.attn_output.weight" in quantized) == (outtype == "q8_0")


def test_the_fast_header_reader_reads_what_gguf_reader_reads(ggufs):
    path = ggufs["mixtral", "q8_0"]  # small vocabulary: GGUFReader takes seconds on SmolLM2's
    reader, header = gguf.GGUFReader(path), read_gguf_header(path)
    assert {name: field.contents() for name, field in reader.fields.items()
            if not name.startswith("GGUF.")} == header.metadata
    assert {t.name: (int(t.tensor_type), tuple(int(d) for d in t.shape)) for t in reader.tensors} == header.tensors
