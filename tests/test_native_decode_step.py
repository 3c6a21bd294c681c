"""The one-call native decode step (tally/models/native_decode_step.py) computes what the layer-by-layer path
computes."""
from __future__ import annotations

import pytest
import torch

from tally import LLM, SamplingParams
from tally.layers.dense import ConcatLinear
from tally.layers.linear import build_linear
from tally.models.native_decode_step import NativeDecodeStep
from tally.native import ops
from tally.quant.gguf_blocks import IQ4_VALUES
from tally.quant.native_linear import NativeInt4Linear, NativeTableLinear

pytestmark = pytest.mark.skipif(not ops.available(), reason="native kernels unavailable (see tally/native/library.py)")

PROMPTS = ["hello world", "the quick brown fox jumps", "a"]


def run(llm: LLM, prompts: list[str], use_step: bool) -> list:
    model = llm.engine.model
    saved = model.native_step
    if not use_step:
        model.native_step = None
    try:
        return llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=1))
    finally:
        model.native_step = saved


def assert_step_matches_layers(llm: LLM) -> None:
    """The same greedy tokens, and logprobs within 1e-5, with the one-call step and layer by layer."""
    for a, b in zip(run(llm, PROMPTS, True), run(llm, PROMPTS, False)):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for la, lb in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
            tok = next(iter(la))
            assert abs(la[tok].logprob - lb[tok].logprob) < 1e-5


@pytest.mark.parametrize("arch, dtype, quantization", [
    ("llama", "float32", "int4"), ("mistral", "float32", "int8"), ("qwen2", "float32", "int4"),
    ("llama", "float32", "w8a8"), ("llama_tied_mqa", "float16", None), ("qwen3", "float32", "int8"),
    ("llama_tied_mqa", "float32", None),  # fp32 panels (batch_invariant's fp32 path)
])
def test_native_step_equals_the_layer_by_layer_path(tiny_model_factory, arch, dtype, quantization):
    llm = LLM(str(tiny_model_factory(arch)), dtype=dtype, quantization=quantization, kv_cache_memory=2_000_000)
    model = llm.engine.model
    assert model.native_step is not None
    if model.cfg.tie_word_embeddings:  # the native head (fp16 or fp32 panels, int8) serves the lookup: one table
        assert model.embed_tokens is None
        ids = torch.tensor([3, 7, 3])
        assert model.lm_head.embedding_rows(ids).shape == (3, model.cfg.hidden_size)
    assert_step_matches_layers(llm)


# Each dense family's traits: q/k norms per head (qwen3, gemma3) or over the projection (olmo2), sandwich (gemma2,
# gemma3) or output-only norms (olmo2), GELU-tanh, per-layer windows and rotary bases, soft-capped scores and logits
# (gemma2), partial rotary (phi3), NoPE layers (smollm3), multipliers (granite), attention sinks, o_proj's bias and
# clamped SwiGLU experts with biases (gpt_oss). int8 rounds the activations: an ulp apart anywhere shows.
@pytest.mark.parametrize("family, dtype, quantization", [
    ("gemma2", "float32", "int8"), ("gemma2", "float16", None), ("gemma3", "float32", "int8"),
    ("phi3", "float32", "int8"), ("granite", "float32", "int8"), ("olmo2", "float32", "int8"),
    ("smollm3", "float32", "int8"), ("llama3", "float32", "int4"), ("gpt_oss", "float32", "int8"),
    ("gpt_oss", "float32", None),
])
def test_native_step_computes_each_familys_traits_as_the_layers_do(tmp_path_factory, family, dtype, quantization):
    from support.families import make_family_checkpoint

    model_dir = make_family_checkpoint(tmp_path_factory.mktemp(family), family)
    llm = LLM(str(model_dir), dtype=dtype, quantization=quantization, max_model_len=64, kv_cache_memory=2_000_000)
    model = llm.engine.model
    assert model.native_step is not None and model.native_step.scores
    assert_step_matches_layers(llm)
    # greedy without logprobs: bursts of steps in one call where the step starts from token ids (tally_decode_greedy:
    # the argmax of the capped, scaled logits)
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    assert ([o.outputs[0].token_ids for o in llm.generate(PROMPTS, greedy)]
            == [o.outputs[0].token_ids for o in run(llm, PROMPTS, False)])


def test_native_step_rows_do_not_depend_on_their_batch(tiny_llama):
    """Every row goes through the same kernel instructions whatever its batch: tokens and logprobs are equal."""
    llm = LLM(str(tiny_llama), dtype="float32", quantization="int4", kv_cache_memory=2_000_000)

    def tokens_and_logprobs(outs: list) -> list:
        return [(o.outputs[0].token_ids, [{t: lp.logprob for t, lp in d.items()} for d in o.outputs[0].logprobs])
                for o in outs]

    together = tokens_and_logprobs(run(llm, PROMPTS, True))
    alone = [tokens_and_logprobs(run(llm, [p], True))[0] for p in PROMPTS]
    assert together == alone


def test_native_int4_model_stays_close_to_its_dequantized_weights(tiny_llama, monkeypatch):
    """The native kernels quantize activations to int8 per block of 32; logits move by a small fraction."""
    from tally.native.library import load

    params = SamplingParams(temperature=0, max_tokens=1, logprobs=5)
    monkeypatch.setenv("TALLY_NATIVE", "0")
    load.cache_clear()
    exact = LLM(str(tiny_llama), dtype="float32", quantization="int4", kv_cache_memory=2_000_000)
    want = [o.outputs[0].logprobs[0] for o in exact.generate(PROMPTS, params)]
    monkeypatch.delenv("TALLY_NATIVE")
    load.cache_clear()
    fast = LLM(str(tiny_llama), dtype="float32", quantization="int4", kv_cache_memory=2_000_000)
    assert fast.engine.model.native_step is not None
    got = [o.outputs[0].logprobs[0] for o in fast.generate(PROMPTS, params)]
    for g, w in zip(got, want):
        top = max(w, key=lambda t: w[t].logprob)
        assert top in g and abs(g[top].logprob - w[top].logprob) < 0.05


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_int8_kv_cache_in_the_one_call_step_equals_the_layer_by_layer_path(tiny_model_factory, arch):
    """int8 KV with key smoothing: the C step writes (a scale per token and head) and reads
    the cache as tally/attention/kv_cache.py does; 24 tokens cross a 16-slot block."""
    llm = LLM(str(tiny_model_factory(arch)), dtype="float32", quantization="int4", kv_cache_dtype="int8",
              kv_cache_memory=2_000_000)
    model = llm.engine.model
    assert model.layers[0].key_scale is not None
    assert model.native_step.applies(model, llm.engine.kv_caches)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=1)
    saved = model.native_step
    fused = llm.generate(PROMPTS, params)
    model.native_step = None
    try:
        layered = llm.generate(PROMPTS, params)
    finally:
        model.native_step = saved
    # Both round K and V to int8 the same way, but their fp32 inputs differ by an ulp where PyTorch's kernels
    # differ from the C kernel's (AVX-512 builds of PyTorch contract multiply-adds differently from the AVX2
    # kernels): a value on a rounding boundary then lands one int8 step apart. Measured on an AVX-512 BF16 CPU:
    # tokens equal, logprobs within 0.03 (1e-4 on an AVX2-only CPU).
    for a, b in zip(fused, layered):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for la, lb in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
            tok = next(iter(la))
            assert abs(la[tok].logprob - lb[tok].logprob) < 0.05


def test_auto_kv_cache_is_float16_over_quantized_weights_and_the_compute_dtype_over_dense_ones(tiny_llama):
    """auto (tally/ledger/kv.py: auto_kv_dtype): int4 weights computed in fp32 keep an fp16 cache, as llama.cpp does;
    dense fp32 weights keep the oracle's fp32 cache."""
    for quantization, cache_dtype in (("int4", torch.float16), (None, torch.float32)):
        llm = LLM(str(tiny_llama), dtype="float32", quantization=quantization, kv_cache_memory=2_000_000)
        assert llm.engine.kv_caches[0][0].dtype == cache_dtype
        assert f"per token ({str(cache_dtype).removeprefix('torch.')})" in llm.engine.ledger.format()


@pytest.mark.parametrize("kv_cache_dtype, cache_dtype", [("float16", torch.float16), ("bfloat16", torch.bfloat16)])
def test_16_bit_kv_cache_runs_natively_and_as_pytorch_runs_it(tiny_llama, monkeypatch, kv_cache_dtype, cache_dtype):
    """fp16 and bf16 caches: the one-call step takes them (written and read in place, fp32 arithmetic) and matches
    the layer-by-layer path, and the same model with the native kernels off (PyTorch casts into the cache and
    widens what it gathers) picks the same greedy tokens."""
    from tally.native.library import load

    kwargs = dict(dtype="float16", kv_cache_dtype=kv_cache_dtype, kv_cache_memory=2_000_000)
    llm = LLM(str(tiny_llama), **kwargs)
    model = llm.engine.model
    assert llm.engine.kv_caches[0][0].dtype == cache_dtype
    assert f"per token ({kv_cache_dtype})" in llm.engine.ledger.format()  # the start-up log says which
    assert model.native_step.applies(model, llm.engine.kv_caches)
    assert_step_matches_layers(llm)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=1)
    native = llm.generate(PROMPTS, params)
    monkeypatch.setenv("TALLY_NATIVE", "0")
    load.cache_clear()
    try:
        reference = LLM(str(tiny_llama), **kwargs).generate(PROMPTS, params)
    finally:
        monkeypatch.delenv("TALLY_NATIVE")
        load.cache_clear()
    # Measured within 5e-5 on an AVX2-only CPU; the bound leaves room for a value whose fp32 inputs differ by an
    # ulp (PyTorch's kernels against the C ones) to land one 16-bit step apart.
    for a, b in zip(native, reference):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for la, lb in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
            tok = next(iter(la))
            assert abs(la[tok].logprob - lb[tok].logprob) < 0.01


def _int6(weight: torch.Tensor, bias: torch.Tensor) -> NativeInt4Linear:
    """Q6_K's form: 6-bit values in groups of 16, w = d * (q - 32)."""
    groups = weight.view(weight.shape[0], -1, 16)
    d = groups.abs().amax(dim=-1).clamp(min=1e-8) / 31
    q = (groups / d[:, :, None]).round().clamp(-32, 31) + 32
    return NativeInt4Linear(q.to(torch.uint8).view_as(weight), d, None, 16, bias, bits=6)


def test_a_fused_projection_of_parts_in_different_formats_runs_in_the_one_call_step(tiny_model_factory):
    """A GGUF's q and k in Q4_K beside v in Q6_K (Qwen2.5-Coder-1.5B's Q4_K_M file has such layers) load as int4
    beside 6-bit values (ConcatLinear); with fp16 panels as a third part, the one-call step takes them all and
    computes what the layers compute."""
    llm = LLM(str(tiny_model_factory("qwen2")), dtype="float32", quantization="int4", kv_cache_memory=2_000_000)
    model = llm.engine.model
    cfg = model.cfg
    with torch.inference_mode():
        for layer in model.layers:
            fused = layer.qkv_proj
            bias = fused(torch.zeros(1, cfg.hidden_size))[0]
            weight = (fused(torch.eye(cfg.hidden_size)) - bias).T.contiguous()  # [q + k + v, hidden]
            q, qk = cfg.q_size, cfg.q_size + cfg.kv_size
            layer.qkv_proj = ConcatLinear([
                build_linear(weight[:q], bias[:q], quantization="int4", dtype=torch.float32),
                _int6(weight[q:qk], bias[q:qk]),
                build_linear(weight[qk:], bias[qk:], quantization=None, dtype=torch.float32,
                             weight_dtype=torch.float16)])
    model.native_step = NativeDecodeStep.build(model)
    assert model.native_step is not None
    assert_step_matches_layers(llm)


def _iq4_nl(weight: torch.Tensor) -> NativeTableLinear:
    """IQ4_NL's form: per group of 32, d times one of its table's 16 int8 values."""
    table = IQ4_VALUES.long()
    groups = weight.view(weight.shape[0], -1, 32)
    d = groups.abs().amax(dim=-1).clamp(min=1e-8) / 127
    q = ((groups / d[:, :, None])[..., None] - table).abs().argmin(dim=-1)
    return NativeTableLinear(q.to(torch.uint8).view_as(weight), d, table, None)


@pytest.mark.parametrize("arch, embeds, table", [("llama", False, False), ("qwen2", True, False),
                                                 ("qwen2", True, True)])
def test_a_decode_step_ends_in_the_logits_of_any_rows_in_one_call(tiny_model_factory, arch, embeds, table):
    """forward_logits on a decode step runs the final norm and the LM head inside the native call, and where the
    token table is int4 / int8 rows or table indices (qwen2's, tied to its head; `table`: as IQ4_NL's) the lookup
    too: the logits of any rows (in any order, repeated, or none) equal the Python embedding and the layers' output
    through compute_logits."""
    from tally.engine.inputs import build_span_inputs

    llm = LLM(str(tiny_model_factory(arch)), dtype="float32", quantization="int4", kv_cache_memory=2_000_000)
    model, caches = llm.engine.model, llm.engine.kv_caches
    if table:
        with torch.inference_mode():
            head = model.lm_head
            model.lm_head = _iq4_nl(head.embedding_rows(torch.arange(head.out_features)))
        model.native_step = NativeDecodeStep.build(model)
    assert model.native_step.scores and model.native_step.embeds == embeds
    spans = [([1], 0, [5]), ([2], 0, [9]), ([3], 0, [17])]  # (block table, first position, token ids)
    ids, positions, meta, _ = build_span_inputs(spans, llm.engine.kv.block_size, [0, 0, 0])  # all decode rows
    assert meta.is_decode_only
    rows = torch.tensor([2, 0, 2])
    fused = model.forward_logits(ids, positions, caches, meta, rows)
    layered = model.compute_logits(model(ids, positions, caches, meta)[rows])
    assert fused.shape == (3, model.cfg.vocab_size)
    assert torch.equal(fused, layered)
    assert model.forward_logits(ids, positions, caches, meta, rows[:0]).shape == (0, model.cfg.vocab_size)
    if embeds:  # an id outside the table: an error, as PyTorch's lookup gives, before anything runs
        with pytest.raises(IndexError, match="outside a table"):
            model.forward_logits(torch.tensor([5, model.cfg.vocab_size, 17]), positions, caches, meta, rows)
