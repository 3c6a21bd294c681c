"""Speculative decoding by prompt lookup: greedy outputs identical to plain decoding (batched, chunked, with prefix
hits and preemption), sampled outputs from the target's own distribution, every KV block back, bad settings
refused at start."""
from __future__ import annotations

import json
import random

import pytest
from support.engine_checks import (
    assert_first_two_tokens_follow,
    assert_no_block_leak,
    assert_speculation_stops_where_plain_decoding_does,
    bytes_for_blocks,
    first_two_token_probs,
    top_k_probs,
)

from tally import LLM, SamplingParams
from tally.engine.speculation import speculator as speculation
from tally.engine.speculation.ngram_proposer import propose_ngram
from tally.errors import ConfigError
from tally.native import ops
from tally.traces import DATA_DIR

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
FIXED = {**NGRAM, "adaptive": False}  # every proposal verified: the tests check verification, not the policy
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def _prompts(vocab: int, n: int, seed: int = 0) -> list[dict]:
    """Prompts that repeat themselves, so prompt lookup has something to propose."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        motif = [rng.randrange(3, vocab) for _ in range(rng.randint(3, 12))]
        out.append({"prompt_token_ids": (motif * rng.randint(2, 5))[:rng.randint(6, 60)]})
    return out


@pytest.fixture(scope="module")
def reference(tiny_llama):
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory=4_000_000, enable_prefix_caching=False)
    prompts = _prompts(llm.get_tokenizer().vocab_size, 16)
    alone = [llm.generate(p, GREEDY, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]
    return prompts, alone


def _tokens(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


def _spoke(llm) -> None:
    stats = llm.engine.speculator.stats
    assert stats.num_draft_tokens > 0 and stats.num_accepted_tokens > 0, stats


@pytest.mark.parametrize("engine_args", [
    {},
    {"max_num_batched_tokens": 7, "max_num_partial_prefills": 2},  # chunked prefill beside verify steps
    {"max_model_len": 128, "kv_cache_memory": 12},  # 12 blocks for 16 requests: preemption by recompute
], ids=["batched", "chunked", "preempted"])
def test_greedy_tokens_are_those_of_plain_decoding(tiny_llama, reference, engine_args):
    prompts, alone = reference
    if engine_args.get("kv_cache_memory"):
        engine_args = {**engine_args, "kv_cache_memory": bytes_for_blocks(tiny_llama, engine_args["kv_cache_memory"])}
    llm = LLM(str(tiny_llama), dtype="float32", **{"kv_cache_memory": 4_000_000, **engine_args},
              speculative_config=FIXED)
    assert _tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == alone
    _spoke(llm)
    assert_no_block_leak(llm)
    if "max_model_len" in engine_args:
        assert llm.engine.scheduler.num_preemptions > 0


@pytest.mark.skipif(not ops.available(), reason="native kernels unavailable (see tally/native/library.py)")
def test_verify_rows_take_the_native_decode_step(tiny_llama, reference):
    """A verify's positions go in as decode rows, so with native int4 layers the one-call decode step runs them; its
    rows do not depend on their batch, so the tokens are exactly those of plain decoding on the same path."""
    prompts, _ = reference
    plain = LLM(str(tiny_llama), dtype="float32", quantization="int4", kv_cache_memory=4_000_000)
    alone = _tokens(plain.generate(prompts, GREEDY, use_tqdm=False))
    llm = LLM(str(tiny_llama), dtype="float32", quantization="int4", kv_cache_memory=4_000_000,
              speculative_config=FIXED)
    step, running = llm.engine.model.native_step, llm.engine.scheduler.running
    verify_steps = []  # native steps with more rows than requests: proposals among them
    run = step.run
    step.run = lambda h, positions, *rest: (verify_steps.append(len(positions) > len(running))
                                            or run(h, positions, *rest))
    assert _tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == alone
    _spoke(llm)
    assert any(verify_steps)
    assert_no_block_leak(llm)


def test_greedy_with_prefix_hits_and_the_adaptive_policy(tiny_llama, reference):
    prompts, alone = reference
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory=4_000_000, speculative_config=NGRAM)
    assert _tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == alone
    assert _tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == alone  # the second pass hits the cache
    assert llm.engine.kv.stats.hit_tokens > 0
    assert_no_block_leak(llm)


def test_the_step_log_holds_the_proposals_each_step_verified(tiny_llama, reference, tmp_path):
    """--step-log's lines carry what the adaptive policy prices: the proposals a step verified, and what finding them
    took."""
    prompts, alone = reference
    log = tmp_path / "steps.jsonl"
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory=4_000_000, speculative_config=FIXED, step_log=str(log))
    assert _tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == alone
    llm.engine.shutdown()
    steps = [json.loads(line) for line in log.read_text().splitlines()]
    assert sum(s["proposals"] for s in steps) == llm.engine.speculator.stats.num_draft_tokens > 0
    assert all(s["proposing_s"] >= 0 for s in steps) and any(s["proposing_s"] > 0 for s in steps)


def test_stops_max_tokens_and_logprobs_hold_mid_proposal(tiny_llama, reference):
    prompts, _ = reference
    plain = LLM(str(tiny_llama), dtype="float32", kv_cache_memory=4_000_000)
    spec = LLM(str(tiny_llama), dtype="float32", kv_cache_memory=4_000_000, speculative_config=FIXED)
    assert_speculation_stops_where_plain_decoding_does(plain, spec, prompts)
    _spoke(spec)
    assert_no_block_leak(spec)


def test_penalties_see_the_proposals_before_them_as_output(tiny_llama, reference, monkeypatch):
    """Penalties and min_tokens read the output so far, so a position after proposals must count them. Proposals
    that are always right (the plain run's own next tokens) put every position after them to use."""
    prompts, _ = reference
    penalised = SamplingParams(temperature=0.0, max_tokens=24, repetition_penalty=1.1, frequency_penalty=0.3,
                               presence_penalty=0.2, min_tokens=6)
    plain = LLM(str(tiny_llama), dtype="float32", kv_cache_memory=4_000_000)
    expected = [(p["prompt_token_ids"], out) for p, out in
                zip(prompts, _tokens(plain.generate(prompts, penalised, use_tqdm=False)))]

    def right(ids: list[int], lo: int, hi: int, k: int) -> list[int]:
        for prompt, out in expected:
            done = len(ids) - len(prompt)
            if ids[:len(prompt)] == prompt and ids[len(prompt):] == out[:done]:
                return out[done:done + k]
        return []

    monkeypatch.setattr(speculation, "propose_ngram", right)
    spec = LLM(str(tiny_llama), dtype="float32", kv_cache_memory=4_000_000, speculative_config=FIXED)
    assert _tokens(spec.generate(prompts, penalised, use_tqdm=False)) == [out for _, out in expected]
    stats = spec.engine.speculator.stats
    assert stats.num_accepted_tokens == stats.num_draft_tokens > 100, stats
    assert_no_block_leak(spec)


def test_sampled_tokens_follow_the_target_distribution(tiny_llama, monkeypatch):
    """Rejection sampling keeps the target's distribution: the first two sampled tokens (top-k 4, so 16 pairs),
    drawn 3,000 times with a proposal verified for the second, against the exact probabilities from transformers'
    forward of the same weights; a chi-square test at p = 0.001 (the engine's seed makes the run deterministic)."""
    prompt = [5, 9, 14, 3, 22, 7]
    # Proposals the target often accepts and sometimes rejects: for each likely first token, the likeliest second
    # (a prompt that makes lookup propose them cannot be built for a random model: any change moves its guesses).
    likeliest = {a: max(top_k_probs(tiny_llama, prompt + [a]).items(), key=lambda kv: kv[1])[0]
                 for a in top_k_probs(tiny_llama, prompt)}
    monkeypatch.setattr(speculation, "propose_ngram", lambda ids, lo, hi, k: [likeliest[ids[-1]]])

    # max_tokens 3: after the first token, one proposal for the second (and the third comes free if it holds).
    params = SamplingParams(temperature=1.0, top_k=4, max_tokens=3, ignore_eos=True)
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory=8_000_000, speculative_config=FIXED, seed=1)
    outs = llm.generate([{"prompt_token_ids": prompt}] * 3000, params, use_tqdm=False)
    stats = llm.engine.speculator.stats
    assert stats.num_drafts == 3000 and 500 < stats.num_accepted_tokens < 2500, stats
    assert_first_two_tokens_follow(outs, first_two_token_probs(tiny_llama, prompt))
    assert_no_block_leak(llm)


def test_prompt_lookup_proposes_what_followed_the_longest_latest_match():
    assert propose_ngram([1, 2, 3, 4, 1, 2, 3], 2, 5, 3) == [4, 1, 2]
    assert propose_ngram([7, 1, 2, 9, 1, 2, 8, 1, 2], 1, 2, 2) == [8, 1]  # the latest of two matches
    assert propose_ngram([5, 9, 1, 2, 3, 6, 2, 3, 4, 1, 2, 3], 1, 3, 1) == [6]  # 3-gram beats the later 2-gram
    assert propose_ngram([1, 2, 3, 4, 5], 1, 3, 4) == []
    assert propose_ngram([1, 2, 1], 1, 3, 0) == []


def _lookup_by_windows(ids: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """The rule spelled out: every earlier window of every n, longest n first, the latest window."""
    for n in range(min(max_n, len(ids) - 1), min_n - 1, -1):
        starts = [s for s in range(len(ids) - n) if ids[s:s + n] == ids[len(ids) - n:]]
        if starts and k > 0:
            return ids[starts[-1] + n:starts[-1] + n + k]
    return []


def test_prompt_lookup_finds_what_every_window_would():
    rng = random.Random(0)
    for _ in range(3000):
        vocab, lo = rng.randrange(1, 6), rng.randrange(1, 5)
        ids, hi, k = [rng.randrange(vocab) for _ in range(rng.randrange(40))], rng.randrange(lo, 7), rng.randrange(6)
        assert propose_ngram(ids, lo, hi, k) == _lookup_by_windows(ids, lo, hi, k), (ids, lo, hi, k)


@pytest.mark.parametrize("config, message", [
    ({"method": "medusa2", "num_speculative_tokens": 2}, "needs a method"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens must be"),
    ({"model": "x"}, "num_speculative_tokens must be"),  # a draft has no default K
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
     "prompt_lookup_min"),
    ({"method": "ngram", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 1}, "unknown key"),
    ({"method": "eagle", "model": "x", "num_speculative_tokens": 2}, "not supported yet"),
    ({"model": "x", "num_speculative_tokens": 2, "draft_context_tokens": -1}, "draft_context_tokens must be"),
    ({"method": "ngram", "num_speculative_tokens": 2, "draft_context_tokens": 64}, "unknown key"),
    ("{not json", "not JSON"),
])
def test_bad_settings_fail_at_start_with_what_to_fix(tiny_llama, config, message):
    with pytest.raises(ConfigError, match=message):
        LLM(str(tiny_llama), dtype="float32", kv_cache_memory=4_000_000, speculative_config=config)


def test_prompt_lookup_at_its_default_settings_quotes_exactly_what_plain_decoding_does():
    """The built-in model asked to repeat a passage of its prompt, with `{"method": "ngram"}` and nothing else (its
    default K, lookup lengths and the adaptive policy): the same greedy tokens as without speculation, with proposals
    kept (the quoting workload of benchmarks/speculative.py, whose speed is measured there)."""
    passage = (DATA_DIR / "shakespeare.txt").read_text()[20_000:21_000]
    opening = passage[150:200]
    prompt = f"Read this scene.\n\n{passage}\n\nQuote the speech that begins \"{opening}\" word for word.\n\n{opening}"
    params = SamplingParams(temperature=0.0, max_tokens=128)
    plain = LLM(max_model_len=1024, kv_cache_memory=64_000_000)
    expected = _tokens(plain.generate([prompt], params, use_tqdm=False))
    del plain
    spec = LLM(max_model_len=1024, kv_cache_memory=64_000_000, speculative_config={"method": "ngram"})
    assert _tokens(spec.generate([prompt], params, use_tqdm=False)) == expected
    assert spec.engine.speculator.stats.num_accepted_tokens > 0
