"""LoRA adapters on the one-call native decode step (tally/native/lora_delta.h through kernels.c): its logits match the
layer-by-layer path's, offline bursts run adapter rows, and a request's tokens and logprobs are bitwise the same alone
as in a batch mixing adapters and the base (the needle test among many). An int4 base with a tied int8 head: the
call goes from ids to logits."""
from __future__ import annotations

import random

import pytest
import torch

from support.lora_adapters import ALL_TARGETS, make_adapter
from tally import LLM, LoRARequest, SamplingParams
from tally.engine.inputs import build_span_inputs
from tally.models.lora_adapter import load_adapter
from tally.native import ops

pytestmark = pytest.mark.skipif(not ops.available(), reason="native kernels unavailable (see tally/native/library.py)")

PROMPTS = [[5 + i, 9, 17, 30 + i, 41, 3, 8, 60 + 2 * i, 12, 77 - i] for i in range(4)]
NAMES = ["qv", "all", "mlp"]


@pytest.fixture(scope="module")
def tiny_qwen2(tiny_model_factory):
    return tiny_model_factory("qwen2")


@pytest.fixture(scope="module")
def adapters(tiny_qwen2, tmp_path_factory):
    d = tmp_path_factory.mktemp("lora-native")
    return {"qv": make_adapter(tiny_qwen2, d / "qv", 1, ["q_proj", "v_proj"], std=0.05),
            "all": make_adapter(tiny_qwen2, d / "all", 2, ALL_TARGETS, r=4, std=0.05),
            "mlp": make_adapter(tiny_qwen2, d / "mlp", 3, ["o_proj", "up_proj", "down_proj"], r=16, std=0.05,
                                layers_to_transform=[1])}


@pytest.fixture(scope="module")
def llm(tiny_qwen2):
    llm = LLM(str(tiny_qwen2), dtype="float32", quantization="int4", enable_lora=True, max_loras=3,
              max_lora_rank=16, kv_cache_memory=2_000_000, enable_prefix_caching=False)
    assert llm.engine.runner.runs_greedy_steps and llm.engine._burst_limit == 8
    return llm


def lora(adapters, name: str | None) -> LoRARequest | None:
    return None if name is None else LoRARequest(name, NAMES.index(name) + 1, str(adapters[name]))


def test_the_one_call_step_adds_each_rows_delta_as_the_layer_path_does(llm, adapters):
    """One decode step of rows of three adapters and the base: the native step's logits (the deltas added in C after
    each projection) within rounding of the layer-by-layer path's, and the adapters move them."""
    model, caches, bs = llm.engine.model, llm.engine.kv_caches, llm.engine.kv.block_size
    weights = [load_adapter(n, str(adapters[n]), model.cfg, 16, model.dtype).weights for n in NAMES]
    row_slots = torch.tensor([1, -1, 0, 2, 1, 0])
    spans = [([1 + r], 3 + r, [5 + 7 * r]) for r in range(len(row_slots))]
    ids, positions, meta, _ = build_span_inputs(spans, bs, [start for _, start, _ in spans])
    rows = torch.arange(len(row_slots))

    def logits(native: bool, slots: torch.Tensor | None) -> torch.Tensor:
        step = model.native_step
        model.native_step = step if native else None
        if slots is not None:
            model.lora.begin(NAMES, weights, slots)
        try:
            return model.forward_logits(ids, positions, caches, meta, rows)
        finally:
            model.lora.end()
            model.native_step = step

    native, layered = logits(True, row_slots), logits(False, row_slots)
    torch.testing.assert_close(native, layered, rtol=1e-4, atol=1e-4)
    base = logits(True, None)
    assert torch.equal(native[1], base[1])  # the base row is untouched
    for r in (0, 2, 3):
        assert (native[r] - base[r]).abs().max() > 1e-2  # each adapter's delta counts


def test_bursts_run_adapter_rows_and_each_request_gets_its_tokens_alone_or_mixed(llm, adapters):
    """A batch mixing three adapters and the base: each request's greedy tokens those it makes alone, in bursts of
    several steps, the same as one step at a time."""
    engine = llm.engine
    names = [None, "qv", "all", "mlp"]
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)

    def run(prompts, loras, steps):
        engine._burst_limit, before = steps, engine.stats.num_steps
        outs = llm.generate(prompts, params, use_tqdm=False, lora_request=loras)
        return [list(o.outputs[0].token_ids) for o in outs], engine.stats.num_steps - before

    try:
        alone = [run([p], lora(adapters, n), 8)[0][0] for p, n in zip(PROMPTS, names)]
        mixed, burst_steps = run(PROMPTS, [lora(adapters, n) for n in names], 8)
        stepped, one_steps = run(PROMPTS, [lora(adapters, n) for n in names], 1)
    finally:
        engine._burst_limit = 8
    assert mixed == alone == stepped
    assert burst_steps < one_steps
    assert len({tuple(t) for t in alone}) == len(alone)  # each model its own tokens


def test_an_adapter_requests_logprobs_are_bitwise_the_same_alone_and_in_a_mixed_batch(llm, adapters):
    """Logprobs keep each step one at a time on the native step: the request's row beside others' (three adapters and
    the base, more rows of its own adapter) changes no bit of its top logprobs."""
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=5)

    def logprobs(prompts, loras):
        outs = llm.generate(prompts, params, use_tqdm=False, lora_request=loras)
        return [[{t: lp.logprob for t, lp in step.items()} for step in o.outputs[0].logprobs] for o in outs]

    alone = logprobs(PROMPTS[:1], lora(adapters, "all"))[0]
    batch = [None, "qv", "all", "mlp", "all", "qv"]  # row 4: PROMPTS[0] with "all", beside row 2's "all"
    assert logprobs([PROMPTS[i % 4] for i in range(len(batch))], [lora(adapters, n) for n in batch])[4] == alone
    assert logprobs(PROMPTS, [lora(adapters, n) for n in ["all", "qv", None, "mlp"]])[0] == alone


def test_an_adapter_request_gets_its_own_bits_among_many_of_mixed_adapters(llm, adapters):
    """The needle test (tests/test_batch_invariance.py) with adapters: a request of one adapter alone, then at a
    random place among 32-48 random prompts of mixed lengths, each of a random adapter or the base: bitwise the same
    tokens and logprobs, prompts (the layer-by-layer path's deltas) and decodes (the one-call step's) alike."""
    rng = random.Random(0)
    needle = [rng.randrange(3, 300) for _ in range(24)]
    params = SamplingParams(temperature=0, max_tokens=10, logprobs=0, ignore_eos=True)

    def chosen(output) -> tuple[list[int], list[float]]:
        return list(output.token_ids), [lp[t].logprob for lp, t in zip(output.logprobs, output.token_ids)]

    alone = chosen(llm.generate([{"prompt_token_ids": needle}], params, use_tqdm=False,
                                lora_request=lora(adapters, "mlp"))[0].outputs[0])
    for _ in range(2):
        others = [[rng.randrange(3, 300) for _ in range(rng.randrange(1, 100))] for _ in range(rng.randrange(32, 49))]
        place = rng.randrange(len(others) + 1)
        prompts = [{"prompt_token_ids": p} for p in others[:place] + [needle] + others[place:]]
        each = [SamplingParams(temperature=0, max_tokens=rng.randrange(2, 16), ignore_eos=True) for _ in others]
        loras = [lora(adapters, rng.choice([None, *NAMES])) for _ in others]
        outs = llm.generate(prompts, each[:place] + [params] + each[place:], use_tqdm=False,
                            lora_request=loras[:place] + [lora(adapters, "mlp")] + loras[place:])
        assert chosen(outs[place].outputs[0]) == alone
