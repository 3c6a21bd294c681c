"""Batching, chunking, prefix caching and preemption never change a greedy output."""
from __future__ import annotations

import random

import pytest
from support.engine_checks import assert_no_block_leak, bytes_for_blocks

from tally import LLM, SamplingParams
from tally.bench.gap_attribution import read_steps

GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


def _prompts(tok, n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    vocab = tok.vocab_size
    return [{"prompt_token_ids": [rng.randrange(3, vocab) for _ in range(rng.randint(3, 60))]} for _ in range(n)]


@pytest.fixture(scope="module", params=["llama", "mistral"])
def model_dir(request, tiny_model_factory):
    return tiny_model_factory(request.param)


@pytest.fixture(scope="module")
def reference(model_dir):
    """Each prompt alone: the outputs every other configuration must reproduce."""
    llm = LLM(str(model_dir), dtype="float32", kv_cache_memory=4_000_000, enable_prefix_caching=False)
    prompts = _prompts(llm.get_tokenizer(), 16)
    alone = [llm.generate(p, GREEDY)[0].outputs[0].token_ids for p in prompts]
    return prompts, alone


def _tokens(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


def joining_running_streams(llm: LLM, prompts: list[dict]) -> list[list[int]]:
    """Arrivals while others decode: the first prompt runs three steps, then the rest join its stream; each
    request's tokens, in the prompts' order."""
    llm.engine.add_request("first", prompts[0], GREEDY)
    for _ in range(3):
        llm.engine.step()
    for i, p in enumerate(prompts[1:], 1):
        llm.engine.add_request(f"r{i}", p, GREEDY)
    final = llm.engine.run_until_done()
    return [final["first"].outputs[0].token_ids] + [final[f"r{i}"].outputs[0].token_ids
                                                    for i in range(1, len(prompts))]


def test_batch_of_16_mixed_lengths_matches_alone(model_dir, reference):
    prompts, alone = reference
    llm = LLM(str(model_dir), dtype="float32", kv_cache_memory=4_000_000)
    assert _tokens(llm.generate(prompts, GREEDY)) == alone
    assert_no_block_leak(llm)


def test_chunked_prefill_with_chunk_7_matches_unchunked(model_dir, reference):
    prompts, alone = reference
    llm = LLM(str(model_dir), dtype="float32", kv_cache_memory=4_000_000, max_num_batched_tokens=7,
              max_num_partial_prefills=2)
    assert _tokens(llm.generate(prompts, GREEDY)) == alone
    assert_no_block_leak(llm)


def test_a_latency_target_that_shrinks_every_step_matches_unchunked(model_dir, reference):
    """--max-itl far below any step: each step with decodes holds them plus one block of prompt."""
    prompts, alone = reference
    llm = LLM(str(model_dir), dtype="float32", kv_cache_memory=4_000_000, max_itl_s=1e-9, block_size=4)
    assert joining_running_streams(llm, prompts) == alone
    assert_no_block_leak(llm)


def test_prompts_beside_decodes_under_a_target_match_alone_and_are_logged(model_dir, reference, tmp_path):
    """A latency target every step fits: prompts joining running streams give their outputs alone; the step log
    (--step-log) holds every step, read back as benchmarks/itl_under_trace.py --attribute reads it."""
    prompts, alone = reference
    log = tmp_path / "steps.jsonl"
    llm = LLM(str(model_dir), dtype="float32", kv_cache_memory=4_000_000, max_itl_s=1e3, step_log=str(log))
    assert joining_running_streams(llm, prompts) == alone
    llm.engine.shutdown()
    steps = read_steps(log.read_text().splitlines())
    assert len(steps) == llm.engine.stats.num_steps
    # a prompt's pass run in slices beside decode steps counts its tokens in the step it ends
    assert sum(s.prompt_tokens + s.slice_ends * s.slice_tokens for s in steps) == llm.engine.stats.prompt_tokens
    assert any(s.decode_rows and s.slice_tokens for s in steps)  # prompts did go beside decodes


def test_prefix_cache_hits_do_not_change_outputs(model_dir, reference):
    prompts, alone = reference
    llm = LLM(str(model_dir), dtype="float32", kv_cache_memory=4_000_000, block_size=4)
    first = _tokens(llm.generate(prompts, GREEDY))
    second = _tokens(llm.generate(prompts, GREEDY))  # every full prompt block is a hit now
    assert first == alone and second == alone
    stats = llm.engine.kv.stats
    assert stats.hit_tokens > 0 and 0 < llm.engine.snapshot().prefix_hit_rate < 1
    assert_no_block_leak(llm)


def test_preemption_by_recompute_does_not_change_outputs(model_dir, reference):
    prompts, alone = reference
    # 12 blocks of 16 tokens for 16 requests of up to 70 tokens: the pool must preempt.
    llm = LLM(str(model_dir), dtype="float32", block_size=16, max_model_len=128,
              kv_cache_memory=bytes_for_blocks(model_dir, 12), enable_prefix_caching=False, preemption_mode="recompute")
    assert _tokens(llm.generate(prompts, GREEDY)) == alone
    assert llm.engine.scheduler.num_preemptions > 0
    assert_no_block_leak(llm)


def test_static_scheduling_gives_the_same_outputs(model_dir, reference):
    prompts, alone = reference
    llm = LLM(str(model_dir), dtype="float32", kv_cache_memory=4_000_000, scheduling="static", max_num_seqs=5)
    assert _tokens(llm.generate(prompts, GREEDY)) == alone
    assert_no_block_leak(llm)


def test_sliding_window_requests_hold_only_the_blocks_their_window_needs(tiny_model_factory):
    """Mistral's window is 12 tokens: with 4-token blocks a running request holds at most 5 blocks however
    long it gets, and its greedy output is the transformers oracle's."""
    from support.engine_checks import hf_greedy

    model_dir = tiny_model_factory("mistral")
    llm = LLM(str(model_dir), dtype="float32", kv_cache_memory=4_000_000, block_size=4, max_num_batched_tokens=8)
    engine, prompt = llm.engine, list(range(5, 45))
    engine.add_request("long", {"prompt_token_ids": prompt}, SamplingParams(temperature=0, max_tokens=24,
                                                                             ignore_eos=True))
    held, final = [], {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            final[out.request_id] = out
        held.append(engine.kv.num_held_blocks("long"))
    assert max(held) <= 5 and len(held) > 10
    assert list(final["long"].outputs[0].token_ids) == hf_greedy(model_dir, prompt, 24)[0]
    assert_no_block_leak(llm)

