"""The built-in SmolLM2-135M GGUF (Q4_1, Q8_0 embeddings) against transformers as the oracle:
transformers dequantizes and un-permutes the same file with its own code. Its tensors and tokenizer are the
oracle's, and the engine dequantized (quantization="none") in fp32 gives its greedy tokens, logprobs within 1e-3."""
from __future__ import annotations

import pytest
import torch
from support.engine_checks import assert_no_block_leak, hf_greedy

from tally import LLM, SamplingParams
from tally.models.loader import load_checkpoint
from tally.models.tokenizer import load_tokenizer, stop_token_ids

pytestmark = pytest.mark.slow

PROMPTS = [
    "Hello world, café 🙂",
    "  leading spaces\n\ndef f(x):\n\treturn x ** 2  # 12345",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n",
    "日本語 Ωμέγα ñandú",
]


@pytest.fixture(scope="module")
def builtin():
    return load_checkpoint(None)


@pytest.fixture(scope="module")
def transformers_state_dict(builtin_hf_reference):
    model = builtin_hf_reference[1]
    return {name: tensor.detach() for name, tensor in model.state_dict().items()}, model.config


def test_builtin_config(builtin):
    c = builtin.config
    assert (builtin.name, builtin.format) == ("smollm2-135m", "gguf")
    assert (c.architecture, c.num_layers, c.hidden_size, c.intermediate_size) == ("llama", 30, 576, 1536)
    assert (c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size) == (9, 3, 64, 49152)
    assert c.tie_word_embeddings and not c.attention_bias and not c.qk_norm
    assert (c.rope_theta, c.rms_norm_eps, c.max_position_embeddings) == (100000.0, 1e-5, 8192)
    assert c.num_parameters() == 134_515_008


def test_builtin_tensors_equal_what_transformers_loads(builtin, transformers_state_dict):
    theirs, config = transformers_state_dict
    assert config.num_key_value_heads == builtin.config.num_kv_heads
    ours = dict(builtin.tensors())
    assert set(theirs) - set(ours) == {"lm_head.weight"}  # tied: transformers lists it, we do not
    assert set(ours) <= set(theirs)
    for name, tensor in ours.items():
        assert tensor.dtype == torch.float32 and tensor.shape == theirs[name].shape, name
        torch.testing.assert_close(tensor, theirs[name], rtol=0, atol=1e-6, msg=name)


def test_builtin_raw_q_blocks_dequantize_to_the_loaded_tensor(builtin):
    from gguf.quants import dequantize

    name = "model.layers.3.self_attn.q_proj.weight"
    raw = builtin.gguf_tensor(name)
    assert raw.ggml_type.name == "Q4_1" and raw.shape == (576, 576) and raw.data.shape == (576, 18 * 20)
    loaded = next(tensor for tensor_name, tensor in builtin.tensors() if tensor_name == name)
    assert torch.equal(torch.from_numpy(dequantize(raw.data, raw.ggml_type)), loaded)


def test_builtin_tokenizer_matches_transformers_and_stops_on_im_end(builtin, builtin_hf_reference):
    tok, reference = load_tokenizer(builtin), builtin_hf_reference[0]
    for text in PROMPTS:
        ids = tok(text).input_ids
        assert ids == reference(text).input_ids
        assert tok.decode(ids) == reference.decode(ids) == text
    messages = [{"role": "user", "content": "Hi"}]
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert tok.convert_tokens_to_ids("<|im_end|>") == 2
    assert 2 in stop_token_ids(tok, builtin.config)


def test_builtin_model_greedy_matches_transformers(builtin_hf_reference):
    llm = LLM(None, dtype="float32", quantization="none", max_model_len=512, kv_cache_memory=64_000_000)
    tok = llm.get_tokenizer()
    chat = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                   add_generation_prompt=True, tokenize=False)
    prompts = [chat, "def fibonacci(n):"]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=0)
    outs = llm.generate([{"prompt_token_ids": tok.encode(p, add_special_tokens=False)} for p in prompts], params)
    for prompt, out in zip(prompts, outs):
        ref_ids, ref_lp = hf_greedy(builtin_hf_reference[1], tok.encode(prompt, add_special_tokens=False), 24)
        got = out.outputs[0]
        assert got.token_ids == ref_ids
        got_lp = [d[t].logprob for d, t in zip(got.logprobs, got.token_ids)]
        assert max(abs(a - b) for a, b in zip(got_lp, ref_lp)) < 1e-3
    assert "Paris" in outs[0].outputs[0].text
    assert_no_block_leak(llm)
