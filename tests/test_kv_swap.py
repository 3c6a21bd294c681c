"""Preemption by swapping: a preempted request's full blocks wait in the swap space and come back when it resumes.
Greedy outputs are those of a pool large enough never to preempt (fp32 and int8 pools: the partial last block comes
back as it was, where recomputing an int8 block would quantize it afresh; a sliding window; speculation with the
target as its own draft), every block goes back to the pool and the swap space ends empty; a request that
ends while swapped out leaves nothing behind; the choice between swapping and recomputing follows the measured
prices; the opt-in int8 copies of a float pool stay within half a quantization step."""
from __future__ import annotations

import random

import pytest
import torch
from support.engine_checks import assert_no_block_leak

from tally import LLM, SamplingParams
from tally.attention.kv_blocks import ExactBlocks, Int8Blocks
from tally.core.request import Request
from tally.engine.kv_tiers.swap_space import SwapSpace
from tally.errors import ConfigError
from tally.server.metrics import ServerMetrics

GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
# 16 blocks for 16 requests of up to 6 blocks each: the pool must preempt
SMALL_POOL = {"block_size": 16, "num_gpu_blocks_override": 16, "max_num_batched_tokens": 64}


def _prompts(vocab: int, n: int = 16) -> list[dict]:
    rng = random.Random(0)
    return [{"prompt_token_ids": [rng.randrange(3, vocab) for _ in range(rng.randint(20, 70))]} for _ in range(n)]


def _tokens(llm: LLM, prompts: list[dict]) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]


def _assert_swap_space_empty(llm: LLM) -> None:
    s = llm.engine.snapshot().swap
    assert s.held_bytes == 0 and s.num_requests == 0 and s.swapped_in_blocks == s.swapped_out_blocks
    assert_no_block_leak(llm)


@pytest.mark.parametrize("arch, kv_cache_dtype", [("llama", "auto"), ("llama", "int8"), ("llama", "float16"),
                                                   ("mistral", "auto")])
def test_swapped_requests_generate_what_unpreempted_ones_do(tiny_model_factory, arch, kv_cache_dtype):
    model = str(tiny_model_factory(arch))
    common = {"dtype": "float32", "kv_cache_dtype": kv_cache_dtype, "enable_prefix_caching": False}
    big = LLM(model, kv_cache_memory=4_000_000, **common)
    prompts = _prompts(big.get_tokenizer().vocab_size)
    alone = _tokens(big, prompts)
    assert big.engine.scheduler.num_preemptions == 0
    llm = LLM(model, preemption_mode="swap", **SMALL_POOL, **common)
    assert _tokens(llm, prompts) == alone
    assert llm.engine.snapshot().swap.num_swapped > 0
    _assert_swap_space_empty(llm)


def test_swapping_under_a_draft_model_keeps_outputs_and_acceptance(tiny_llama):
    """The target as its own draft proposes exactly what it samples: draft KV that a swap left wrong, and the draft
    then read, would show as a rejected proposal."""
    big = LLM(str(tiny_llama), dtype="float32", kv_cache_memory=4_000_000, enable_prefix_caching=False)
    prompts = _prompts(big.get_tokenizer().vocab_size, 12)
    alone = _tokens(big, prompts)
    draft = {"method": "draft_model", "model": str(tiny_llama), "num_speculative_tokens": 3, "adaptive": False}
    llm = LLM(str(tiny_llama), dtype="float32", preemption_mode="swap", speculative_config=draft, **SMALL_POOL)
    assert _tokens(llm, prompts) == alone
    stats = llm.engine.speculator.stats
    assert stats.num_draft_tokens > 0 and stats.num_accepted_tokens == stats.num_draft_tokens, stats
    assert llm.engine.snapshot().swap.num_swapped > 0
    _assert_swap_space_empty(llm)


def test_the_swap_space_is_in_the_ledger_and_the_metrics(tiny_llama):
    llm = LLM(str(tiny_llama), dtype="float32", preemption_mode="swap", **SMALL_POOL)
    _tokens(llm, _prompts(llm.get_tokenizer().vocab_size))
    swap = llm.engine.snapshot().swap
    assert "swap space up to 4.00 GiB" in llm.engine.ledger.format()
    text = ServerMetrics("tiny", llm.engine.snapshot).render().decode()
    for name, value in (("kv_swapped_out_blocks_total", swap.swapped_out_blocks),
                        ("kv_swapped_in_blocks_total", swap.swapped_in_blocks),
                        ("kv_swap_preemptions_total", swap.num_swapped), ("num_requests_swapped", 0)):
        assert f'tally:{name}{{model_name="tiny"}} {float(value)}' in text, name


def test_recompute_mode_never_swaps_and_gives_the_same_outputs(tiny_llama):
    big = LLM(str(tiny_llama), dtype="float32", kv_cache_memory=4_000_000, enable_prefix_caching=False)
    prompts = _prompts(big.get_tokenizer().vocab_size)
    llm = LLM(str(tiny_llama), dtype="float32", preemption_mode="recompute", **SMALL_POOL)
    assert _tokens(llm, prompts) == _tokens(big, prompts)
    snap = llm.engine.snapshot()
    assert snap.num_preemptions > 0 and snap.swap is None
    assert_no_block_leak(llm)


def test_a_request_aborted_while_swapped_out_leaves_nothing_behind(tiny_llama):
    llm = LLM(str(tiny_llama), dtype="float32", preemption_mode="swap", **SMALL_POOL)
    engine = llm.engine
    for i, p in enumerate(_prompts(llm.get_tokenizer().vocab_size)):
        engine.add_request(f"r{i}", p, GREEDY)
    while not engine.snapshot().swap.num_requests:
        engine.step()
    swapped = [r.request_id for r in engine.scheduler.waiting if engine.kv_tiers.swap.swapped_tokens(r.request_id)]
    for rid in swapped:
        engine.abort_request(rid)
    engine.run_until_done()
    assert engine.snapshot().swap.held_bytes == 0
    assert_no_block_leak(llm)


def _pool(num_blocks: int = 4) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(num_blocks, 16, 2, 8, generator=gen) for _ in range(4)]  # 2 layers' K and V


def _request(computed: int) -> Request:
    req = Request("r", list(range(computed + 8)), 4, 0.0)
    req.num_computed_tokens = computed
    return req


@pytest.mark.parametrize("recompute_s, swaps", [(1e9, True), (0.0, False), (None, False)],
                         ids=["recompute-dearer", "recompute-cheaper", "recompute-unpriced"])
def test_auto_mode_swaps_exactly_when_recomputing_is_priced_higher(recompute_s, swaps):
    swap = SwapSpace(ExactBlocks(_pool()), 2**30, 16, "auto", lambda tokens: recompute_s)
    assert swap.swap_out(_request(32), [2, 0]) is swaps
    assert swap.swapped_tokens("r") == (32 if swaps else 0)
    assert swap.stats.last_recompute_s == recompute_s and swap.stats.last_swap_s > 0


def test_a_full_swap_space_recomputes():
    pool = _pool()
    swap = SwapSpace(ExactBlocks(pool), ExactBlocks(pool).nbytes, 16, "swap", lambda tokens: None)
    assert not swap.swap_out(_request(32), [0, 1])  # two blocks do not fit in one block's room
    assert swap.swap_out(_request(16), [1])


def test_a_partial_last_block_goes_too():
    swap = SwapSpace(ExactBlocks(_pool()), 2**30, 16, "swap", lambda t: None)
    assert swap.swap_out(_request(20), [3, 1])
    assert swap.swapped_tokens("r") == 20 and swap.stats.swapped_out_blocks == 2


def test_blocks_come_back_bit_exact_into_other_blocks():
    pool = _pool()
    before = [t[[1, 3]].clone() for t in pool]
    swap = SwapSpace(ExactBlocks(pool), 2**30, 16, "swap", lambda tokens: None)
    assert swap.swap_out(_request(32), [1, 3])
    for t in pool:
        t[[0, 2]] = 0.0
    swap.swap_in("r", [2, 0, 1])
    assert all(torch.equal(t[[2, 0]], b) for t, b in zip(pool, before))
    assert swap.swapped_tokens("r") == 0 and swap.stats.held_bytes == 0


def test_int8_copies_of_a_float_pool_stay_within_half_a_step():
    pool = [t.to(torch.bfloat16) for t in _pool()] + _pool()
    codec = Int8Blocks(pool)
    ids = torch.tensor([0, 3])
    before = [t[ids].float() for t in pool]
    data = codec.read(ids)
    assert data.shape == (2, codec.nbytes) and codec.nbytes < ExactBlocks(pool).nbytes / 2
    codec.write(ids, data)
    for t, b in zip(pool, before):
        step = b.abs().amax(dim=(1, 3), keepdim=True) / 127
        slack = 0.0 if t.dtype == torch.float32 else b.abs() / 128  # bf16's own rounding on the way back
        assert ((t[ids].float() - b).abs() <= step / 2 + slack + 1e-6).all()


def test_swapping_needs_a_swap_space(tiny_llama):
    with pytest.raises(ConfigError, match="swap_space"):
        LLM(str(tiny_llama), dtype="float32", preemption_mode="swap", swap_space=0)
