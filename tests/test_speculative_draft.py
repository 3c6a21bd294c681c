"""Speculative decoding with a draft model: greedy outputs identical to plain decoding (batched, chunked, with prefix
hits and preemption), sampled outputs from the target's own distribution when the draft's differs, the draft's KV in
a pool of its own sized for its windows (requests share it, the least recently drafted for giving way), every block
back after requests finish or are aborted, sliding-window models as target and draft, bad drafts refused at start."""
from __future__ import annotations

import random
import re

import pytest
import torch
from support.draft_models import make_perturbed_draft, make_small_draft
from support.engine_checks import (
    assert_first_two_tokens_follow,
    assert_no_block_leak,
    assert_speculation_stops_where_plain_decoding_does,
    bytes_for_blocks,
    first_two_token_probs,
)
from support.families import make_family_checkpoint
from support.tiny_models import make_checkpoint, make_tokenizer

from tally.engine.speculation.draft_kv import DraftBlocks, window_tokens

from tally import LLM, SamplingParams
from tally.engine.config import EngineConfig
from tally.engine.speculation.draft_model import load_draft
from tally.errors import ConfigError
from tally.layers.path_timing import bf16_many_tokens_capable
from tally.models.loader import load_checkpoint
from tally.models.tokenizer import load_tokenizer

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
KV = 4_000_000


def _draft(path, k: int = 3, **more) -> dict:
    return {"method": "draft_model", "model": str(path), "num_speculative_tokens": k, "adaptive": False, **more}


@pytest.fixture(scope="module")
def drafts(tiny_llama, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("drafts")
    return {"itself": tiny_llama, "small": make_small_draft(root / "small"),
            "perturbed": make_perturbed_draft(tiny_llama, root / "perturbed")}


def _plain_decoding(model) -> tuple[list[dict], list[list[int]]]:
    """12 random prompts of 5-60 tokens, and the model's greedy tokens for each alone"""
    llm = LLM(str(model), dtype="float32", kv_cache_memory=KV, enable_prefix_caching=False)
    rng = random.Random(0)
    vocab = llm.get_tokenizer().vocab_size
    prompts = [{"prompt_token_ids": [rng.randrange(3, vocab) for _ in range(rng.randint(5, 60))]} for _ in range(12)]
    return prompts, [llm.generate(p, GREEDY, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]


@pytest.fixture(scope="module")
def reference(tiny_llama):
    return _plain_decoding(tiny_llama)


def _tokens(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


BATCHED, CHUNKED = {}, {"max_num_batched_tokens": 7, "max_num_partial_prefills": 2}  # chunks beside verify steps
PREEMPTED = {"max_model_len": 128, "kv_cache_memory": 12}  # 12 blocks for 12 requests: preemption by recompute


@pytest.mark.parametrize("engine_args, which", [
    (BATCHED, "itself"), (BATCHED, "small"), (CHUNKED, "perturbed"), (PREEMPTED, "perturbed"), (PREEMPTED, "itself"),
], ids=["batched-itself", "batched-small", "chunked-perturbed", "preempted-perturbed", "preempted-itself"])
def test_greedy_tokens_are_those_of_plain_decoding(tiny_llama, drafts, reference, engine_args, which):
    prompts, alone = reference
    draft = drafts[which]
    if engine_args.get("kv_cache_memory"):  # n blocks of each: the draft's pool takes its share of the budget
        n = engine_args["kv_cache_memory"]
        engine_args = {**engine_args, "kv_cache_memory": bytes_for_blocks(tiny_llama, n) + bytes_for_blocks(draft, n)}
    llm = LLM(str(tiny_llama), dtype="float32", **{"kv_cache_memory": KV, **engine_args},
              speculative_config=_draft(draft))
    assert _tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == alone
    stats = llm.engine.speculator.stats
    assert stats.num_draft_tokens > 0, stats
    if which == "itself":  # the target as its own draft proposes exactly what it then samples
        assert stats.num_accepted_tokens == stats.num_draft_tokens, stats
    if which == "perturbed":
        assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens, stats
    assert_no_block_leak(llm)
    if "max_model_len" in engine_args:
        assert llm.engine.scheduler.num_preemptions > 0


def test_prefix_hits_and_the_adaptive_policy_keep_the_drafts_kv_whole(tiny_llama, reference):
    """A prefix hit gives the target's KV, not the draft's (the draft never wrote it for this request), and a draft
    that sat out an epoch with speculation off must catch up: with the target as its own draft, a stale or missing
    draft entry anywhere would show as a rejected proposal."""
    prompts, alone = reference
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory=KV,
              speculative_config=_draft(tiny_llama, 4, adaptive=True))
    for _ in range(3):  # later passes hit the cache; the policy measures an epoch off, then one on
        assert _tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == alone
    stats = llm.engine.speculator.stats
    assert llm.engine.kv.stats.hit_tokens > 0
    assert stats.num_accepted_tokens == stats.num_draft_tokens > 0, stats
    assert_no_block_leak(llm)


def test_while_speculation_is_off_the_draft_does_not_run_and_then_catches_up_in_one_pass(tiny_llama, reference):
    """"Off" costs the draft nothing: while the policy measures speculation off, no draft pass runs. Measuring it on
    speculates one request in four, the one the draft is least behind on (here: the shortest), whose every token the
    first proposal runs in one pass; with the target as its own draft every proposal then holds."""
    prompts, alone = reference
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory=KV,
              speculative_config=_draft(tiny_llama, 4, adaptive=True))
    engine, spec = llm.engine, llm.engine.speculator
    passes = []  # tokens in each of the draft's forward passes
    forward = spec.draft._forward
    spec.draft._forward = lambda spans, first: (passes.append(sum(len(t) for _, _, t in spans))
                                                or forward(spans, first))
    for i, p in enumerate(prompts[:4]):
        engine.add_request(str(i), p, GREEDY)
    while not spec.policy.speculate_now():
        engine.step()
    assert passes == [] and spec.stats.num_draft_tokens == 0
    shortest = min(r.num_tokens for r in engine.scheduler.running)
    engine.step()
    assert len(engine.scheduler.running) == 4 and passes[0] == shortest and spec.stats.num_drafts == 1
    final = engine.run_until_done()
    assert [final[str(i)].outputs[0].token_ids for i in range(4)] == alone[:4]
    assert spec.stats.num_accepted_tokens == spec.stats.num_draft_tokens > 0, spec.stats
    assert_no_block_leak(llm)


def test_the_drafts_kv_is_the_targets_bit_for_bit(tiny_llama):
    """The target as its own draft, fp32: every position's K/V the draft writes equals the target's in every layer,
    bit for bit, because each runs through the kernel the target ran it with: a prompt shorter than a proposal's
    own pass through the prefill kernel, and outputs the draft catches up on after a spell without speculation
    through the decode kernel (the two kernels' sums differ in the last bits)."""
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory=KV, speculative_config=_draft(tiny_llama, 3))
    engine, spec = llm.engine, llm.engine.speculator
    params = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    engine.add_request("short", {"prompt_token_ids": list(range(5, 14))}, params)
    engine.step()  # the prompt
    engine.step()  # the first proposal: its pass holds the 9 prompt tokens and the first output

    def assert_same_kv(req_id: str) -> None:
        req = next(r for r in engine.scheduler.running if r.request_id == req_id)
        state, bs = spec.draft._states[req], engine.kv.block_size
        assert state.offset == 0  # a short request: the draft reads all of it
        positions = torch.arange(state.computed)
        table, draft_table = torch.tensor(engine.kv.block_table(req_id)), torch.tensor(state.blocks)
        slots = table[positions // bs] * bs + positions % bs
        draft_slots = draft_table[positions // bs] * bs + positions % bs
        for (k, v), (dk, dv) in zip(engine.kv_caches, spec.draft.draft.kv_caches):
            flat = [c.reshape(-1, *c.shape[2:])[at] for c, at in ((k, slots), (v, slots), (dk, draft_slots),
                                                                   (dv, draft_slots))]
            assert torch.equal(flat[0], flat[2]) and torch.equal(flat[1], flat[3])

    assert spec.stats.num_drafts == 1
    assert_same_kv("short")
    engine.speculator = None  # a spell without speculation: the target decodes 20 tokens the draft has not run
    for _ in range(20):
        engine.step()
    engine.speculator = spec
    engine.step()  # the draft catches up on them in one pass
    assert spec.stats.num_drafts == 2
    assert_same_kv("short")
    final = engine.run_until_done()
    assert spec.stats.num_accepted_tokens == spec.stats.num_draft_tokens > 0, spec.stats
    assert len(final["short"].outputs[0].token_ids) == 60


@pytest.mark.parametrize("engine_args", [CHUNKED, PREEMPTED], ids=["chunked", "preempted"])
def test_a_draft_that_reads_only_the_last_tokens_changes_no_output(tiny_llama, reference, engine_args):
    """draft_context_tokens: a fresh start on a request runs the draft over its last tokens only, and one whose
    window grew to the rebase point starts afresh (its table never longer than the window the pool is sized by), with
    chunked prefill or preemption in play; the outputs are plain decoding's."""
    prompts, alone = reference
    window = 8
    if engine_args.get("kv_cache_memory"):  # the target is its own draft: n blocks of each
        blocks = engine_args["kv_cache_memory"]
        engine_args = {**engine_args, "kv_cache_memory": 2 * bytes_for_blocks(tiny_llama, blocks)}
    llm = LLM(str(tiny_llama), dtype="float32", **{"kv_cache_memory": KV, **engine_args},
              speculative_config=_draft(tiny_llama, 3, draft_context_tokens=window))
    spec, bs = llm.engine.speculator, llm.engine.kv.block_size
    passes, tables = [], []
    forward = spec.draft._forward
    spec.draft._forward = lambda spans, first: (passes.append(max(len(t) for _, _, t in spans)),
                                                tables.append(max(len(table) for table, _, _ in spans)),
                                                forward(spans, first))[-1]
    assert _tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == alone
    assert 0 < max(passes) < window + bs and spec.stats.num_draft_tokens > 0
    longest = window_tokens(window, bs, llm.engine.max_model_len)
    assert max(tables) * bs <= longest + bs - 1 and max(tables) > -(-(window + bs) // bs)  # grew, then rebased
    assert (llm.engine.scheduler.num_preemptions > 0) == ("max_model_len" in engine_args)
    assert_no_block_leak(llm)


@pytest.fixture(scope="module")
def windowed(tiny_model_factory, tmp_path_factory) -> dict:
    """Sliding-window models, each with its plain decoding (_plain_decoding): Mistral's (every layer, 12 tokens),
    Gemma 3's (five sliding layers of 8 tokens to one global, each kind with its own rope base)"""
    models = {"mistral": tiny_model_factory("mistral"),
              "gemma3": make_family_checkpoint(tmp_path_factory.mktemp("gemma3"), "gemma3")}
    return {family: (model, *_plain_decoding(model)) for family, model in models.items()}


@pytest.mark.parametrize("family", ["mistral", "gemma3"])
@pytest.mark.parametrize("engine_args, context", [(CHUNKED, 0), (PREEMPTED, 0), (BATCHED, 16)],
                         ids=["chunked", "preempted", "last-tokens"])
def test_sliding_window_models_draft_for_themselves_and_keep_plain_decodings_outputs(windowed, family, engine_args,
                                                                                   context):
    """A sliding-window target gives back the blocks its window left behind as it verifies proposals (only kept
    tokens count), and a sliding-window draft masks its own table by its own windows: as its own draft over whole
    contexts every proposal holds; reading only its last tokens, it proposes less well, and the outputs are still
    plain decoding's."""
    model, prompts, alone = windowed[family]
    if engine_args.get("kv_cache_memory"):  # the target is its own draft: n blocks of each
        engine_args = {**engine_args, "kv_cache_memory": 2 * bytes_for_blocks(model, engine_args["kv_cache_memory"])}
    llm = LLM(str(model), dtype="float32", **{"kv_cache_memory": KV, **engine_args},
              speculative_config=_draft(model, 3, draft_context_tokens=context))
    assert _tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == alone
    stats = llm.engine.speculator.stats
    assert stats.num_draft_tokens > 0, stats
    if not context:
        assert stats.num_accepted_tokens == stats.num_draft_tokens, stats
    if "max_model_len" in engine_args and family == "gemma3":  # Mistral's window gives back enough to hold them all
        assert llm.engine.scheduler.num_preemptions > 0
    assert_no_block_leak(llm)


@pytest.mark.parametrize("engine_args", [BATCHED, CHUNKED], ids=["batched", "chunked"])
def test_a_reduced_draft_vocabulary_proposes_only_its_ids_and_changes_no_output(tiny_llama, reference, engine_args):
    """draft_vocab_size: the draft's head scores the first ids only. With the target as its own draft, a proposal is
    rejected exactly where the target's token lies past them; the outputs are plain decoding's. A request allowed
    only tokens past them is not drafted for (its proposals would have nothing to come from)."""
    prompts, alone = reference
    llm = LLM(str(tiny_llama), dtype="float32", **{"kv_cache_memory": KV, **engine_args},
              speculative_config=_draft(tiny_llama, 3, draft_vocab_size=200))
    spec = llm.engine.speculator
    proposed = []
    propose = spec.draft.propose

    def recorded(*args, **kwargs):
        ids, probs = propose(*args, **kwargs)
        proposed.extend(t for tokens in ids.values() for t in tokens)
        return ids, probs

    spec.draft.propose = recorded
    assert _tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == alone
    assert proposed and max(proposed) < 200
    past = sum(t >= 200 for ids in alone for t in ids)
    assert past and 0 < spec.stats.num_accepted_tokens < spec.stats.num_draft_tokens, spec.stats
    drafted = spec.stats.num_drafts
    allowed = SamplingParams(temperature=1.0, max_tokens=6, allowed_token_ids=[300, 301, 302])
    out = llm.generate(prompts[0], allowed, use_tqdm=False)[0].outputs[0].token_ids
    assert set(out) <= {300, 301, 302} and spec.stats.num_drafts == drafted
    assert_no_block_leak(llm)


def test_a_layers_first_outputs_are_its_outputs_first_columns():
    """What a reduced draft vocabulary's head computes: outputs 0..n-1 of every head layer kind, those of its whole
    forward at one and several rows (the native kernels' one-tile and pair paths): bit for bit on the native
    kernels; PyTorch's matmul blocks a narrower weight differently, so there within rounding."""
    from tally.layers.dense import DenseLinear, Fp16WeightLinear
    from tally.native import ops
    from tally.quant.native_linear import NativeInt4Linear, NativeInt8Linear, NativeW8A8Linear

    g = torch.Generator().manual_seed(0)
    n_out, k = 100, 64
    w, bias = torch.randn(n_out, k, generator=g), torch.randn(n_out, generator=g)
    layers = [DenseLinear(w, bias, torch.float32), Fp16WeightLinear(w, bias)]
    if ops.available():
        q4 = torch.randint(0, 16, (n_out, k), dtype=torch.uint8, generator=g)
        q8 = torch.randint(-127, 128, (n_out, k), dtype=torch.int8, generator=g)
        scales = torch.rand(n_out, k // 32, generator=g) + 0.5
        layers += [NativeInt4Linear(q4, scales, -8 * scales, 32, bias), NativeInt8Linear(q8, scales, bias),
                   NativeW8A8Linear(q8, scales[:, 0], bias, smooth=torch.rand(k, generator=g) + 0.5)]
    for layer in layers:
        for rows in (1, 3, 7):
            x = torch.randn(rows, k, generator=g)
            for n in (1, 37, 64, 99):
                first, whole = layer.first_outputs(x, n), layer(x)[:, :n]
                if isinstance(layer, DenseLinear):
                    torch.testing.assert_close(first, whole, rtol=1e-5, atol=1e-5)
                else:
                    assert torch.equal(first, whole), (type(layer).__name__, rows, n)


def test_a_fresh_start_proposes_what_the_draft_alone_continues_from_the_last_tokens(tiny_llama):
    """The window starts at a block boundary (the draft's KV for position p stays in p's slot) and counts positions
    from there: the proposals are the draft's own greedy continuation of those tokens as a prompt of their own."""
    rng = random.Random(3)
    plain = LLM(str(tiny_llama), dtype="float32", kv_cache_memory=KV, enable_prefix_caching=False)
    three = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    block = plain.engine.kv.block_size
    for n in (block + 7, 2 * block + 8, 4 * block + 6):
        prompt = [rng.randrange(3, plain.get_tokenizer().vocab_size) for _ in range(n)]
        llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory=KV,
                  speculative_config=_draft(tiny_llama, 3, draft_context_tokens=8))
        draft, seen = llm.engine.speculator.draft, []
        propose = draft.propose

        def recorded(reqs, ks, **kw):
            out = propose(reqs, ks, **kw)
            seen.append((reqs[0].token_ids[:], out[0]))
            return out
        draft.propose = recorded
        llm.generate({"prompt_token_ids": prompt}, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
                     use_tqdm=False)
        tokens, proposals = seen[0]
        start = (len(tokens) - 8) // block * block
        alone = plain.generate({"prompt_token_ids": tokens[start:]}, three, use_tqdm=False)[0].outputs[0].token_ids
        (proposed,) = proposals.values()
        assert proposed == alone[:len(proposed)] and len(proposed) == 2, (n, proposed, alone)


def test_the_policy_learns_what_a_catch_up_costs_and_how_long_outputs_run(tiny_llama):
    """The adaptive policy's price for starting on a request: the draft's measured seconds per catch-up token
    (timed on catch-ups of 64 tokens or more) and the finished requests' mean output."""
    rng = random.Random(5)
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory=KV,
              speculative_config=_draft(tiny_llama, 3, adaptive=False))
    vocab = llm.get_tokenizer().vocab_size
    prompts = [{"prompt_token_ids": [rng.randrange(3, vocab) for _ in range(90)]} for _ in range(2)]
    spec = llm.engine.speculator
    assert spec.draft.catch_up_seconds_per_token is None and spec.mean_output_tokens is None
    llm.generate(prompts, GREEDY, use_tqdm=False)
    llm.generate(prompts[:1], GREEDY, use_tqdm=False)  # the next request's first step sees the others finished
    assert spec.draft.catch_up_seconds_per_token > 0
    assert spec.mean_output_tokens == pytest.approx(GREEDY.max_tokens)


def test_stops_max_tokens_and_logprobs_hold_mid_proposal(tiny_llama, drafts, reference):
    prompts, _ = reference
    plain = LLM(str(tiny_llama), dtype="float32", kv_cache_memory=KV)
    spec = LLM(str(tiny_llama), dtype="float32", kv_cache_memory=KV, speculative_config=_draft(drafts["itself"], 4))
    assert_speculation_stops_where_plain_decoding_does(plain, spec, prompts[:6])
    assert_no_block_leak(spec)


def test_every_block_returns_after_aborts(tiny_llama, drafts, reference):
    prompts, _ = reference
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory=KV, speculative_config=_draft(drafts["perturbed"]))
    engine = llm.engine
    params = SamplingParams(temperature=0.8, max_tokens=40, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params)
    for _ in range(6):  # past the prompts: requests hold proposals' blocks when aborted
        engine.step()
    assert engine.speculator.stats.num_draft_tokens > 0
    for i in range(0, len(prompts), 2):
        engine.abort_request(str(i))
    engine.run_until_done()
    assert_no_block_leak(llm)


@pytest.mark.parametrize("vocab", [0, 200], ids=["whole-vocabulary", "reduced-vocabulary"])
def test_sampled_tokens_follow_the_target_distribution(tiny_llama, drafts, vocab):
    """Rejection sampling with a draft whose distribution q differs from the target's p: the first two sampled tokens
    (top-k 4, so 16 pairs), the second drawn by the draft and verified, 2,000 times, against the exact probabilities
    from transformers' forward of the target's weights; a chi-square test at p = 0.001 (seeded: deterministic). With
    a reduced draft vocabulary q is zero past it, where p's tokens then come from the residual alone."""
    prompt = [5, 9, 14, 3, 22, 7]
    params = SamplingParams(temperature=1.0, top_k=4, max_tokens=3, ignore_eos=True)
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory=8_000_000, seed=1,
              speculative_config=_draft(drafts["perturbed"], 2, draft_vocab_size=vocab))
    outs = llm.generate([{"prompt_token_ids": prompt}] * 2000, params, use_tqdm=False)
    stats = llm.engine.speculator.stats
    assert stats.num_drafts == 2000 and 200 < stats.accepted_per_position[0] < 1800, stats
    assert_first_two_tokens_follow(outs, first_two_token_probs(tiny_llama, prompt))
    assert_no_block_leak(llm)


def test_the_ledger_shows_the_drafts_weights_and_kv(tiny_llama, drafts):
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory=KV, speculative_config=_draft(drafts["small"]))
    ledger, d = llm.engine.ledger, llm.engine.ledger.draft
    assert d["weight_bytes"] > 0 and 0 < d["kv_bytes_per_token"] < ledger.kv_bytes_per_token
    assert ledger.kv_pool_bytes == ledger.kv_blocks * ledger.block_size * ledger.kv_bytes_per_token
    assert d["kv_pool_bytes"] == d["kv_blocks"] * ledger.block_size * d["kv_bytes_per_token"] > 0
    assert ledger.kv_pool_bytes + d["kv_pool_bytes"] <= KV
    assert "its own KV pool" in ledger.format()


def test_the_drafts_pool_is_sized_for_its_windows_and_leaves_the_target_the_rest(tiny_llama):
    """The adaptive policy drafts for one running request in four (all of up to three): a pool for that many windows
    of draft_context_tokens (grown to the rebase point, and a step's proposals), not a copy of the target's, and at
    most the share of the budget that holds the draft's KV for one request in four beside the target's; the target
    keeps the rest, where a draft sharing its blocks halved it."""
    def pools(blocks: int) -> tuple[int, int]:
        llm = LLM(str(tiny_llama), dtype="float32", max_num_seqs=16,
                  kv_cache_memory=bytes_for_blocks(tiny_llama, blocks),
                  speculative_config=_draft(tiny_llama, 3, adaptive=True, draft_context_tokens=32))
        return llm.engine.speculator.draft.pool.num_blocks, llm.engine.kv.pool.num_blocks

    window_blocks = -(-window_tokens(32, 16, 256) // 16)  # the tiny model: blocks of 16, a context of 256
    assert pools(400) == (4 * window_blocks, 400 - 4 * window_blocks)  # 16 requests: 4 draft at once
    assert pools(40) == (40 // 5, 40 - 40 // 5)  # a fifth: a quarter of the target's KV beside it


def test_requests_share_a_full_draft_pool_and_keep_their_outputs(tiny_llama, reference):
    """More requests drafting than the draft's pool holds windows for: one that needs room takes the tables of those
    drafted for least recently (they start afresh when next drafted for), or goes without proposals. The target as
    its own draft over whole contexts: every proposal still holds, so no table was read that another overwrote."""
    prompts, alone = reference
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory=KV,
              speculative_config=_draft(tiny_llama, 3, draft_context_tokens=0))
    draft = llm.engine.speculator.draft
    draft.pool = DraftBlocks(12)  # room for two or three of the twelve requests' contexts
    assert _tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == alone
    stats = llm.engine.speculator.stats
    assert draft.evictions > 0 and stats.num_accepted_tokens == stats.num_draft_tokens > 0, stats
    assert_no_block_leak(llm)


def test_bad_drafts_fail_at_start_with_what_to_fix(tiny_llama, drafts, tmp_path):
    other_vocab = make_checkpoint(tmp_path / "other", "llama")
    make_tokenizer(other_vocab, vocab_size=300)  # another tokenizer over the same embedding size
    short = make_checkpoint(tmp_path / "short", "llama", max_position_embeddings=64)
    cases = [
        ({"method": "draft_model", "num_speculative_tokens": 2}, 'needs "model"'),
        (_draft(drafts["small"], 0), "num_speculative_tokens must be"),
        (_draft(tmp_path / "missing"), "draft model: model .* not found"),
        (_draft(other_vocab), "tokenizer differs"),
        (_draft(short), "context of 64 tokens"),
        (_draft(drafts["small"], draft_vocab_size=-1), "draft_vocab_size must be an integer >= 0"),
        (_draft(drafts["small"], draft_vocab_size=10**6), "draft_vocab_size 1,000,000 is larger than the vocabulary"),
        ({"method": "ngram", "num_speculative_tokens": 2, "draft_vocab_size": 100}, "unknown key"),
    ]
    for spec, message in cases:
        with pytest.raises(ConfigError, match=message):
            LLM(str(tiny_llama), dtype="float32", kv_cache_memory=KV, speculative_config=spec)
    # a budget that holds one max_model_len request of the target alone, not with the draft's pool beside it
    with pytest.raises(ConfigError, match="the draft model .* takes") as refused:
        LLM(str(tiny_llama), dtype="float32", max_model_len=256, kv_cache_memory=bytes_for_blocks(tiny_llama, 16),
            speculative_config=_draft(drafts["itself"]))
    # the budget the message asks for is enough: the draft's pool grows with the budget, so not request + its pool
    asked = int(re.search(r"kv-cache-memory to ≥ ([\d,]+)", str(refused.value)).group(1).replace(",", ""))
    llm = LLM(str(tiny_llama), dtype="float32", max_model_len=256, kv_cache_memory=asked,
              speculative_config=_draft(drafts["itself"]))
    assert llm.engine.kv.pool.num_blocks * llm.engine.kv.block_size >= 256


def test_the_draft_takes_the_many_token_path_measured_for_the_target(tiny_llama, drafts):
    """Its catch-up over a prompt is hundreds of rows: on the one-token integer kernels it cost 2-3 s a request."""
    target = load_checkpoint(str(tiny_llama))
    config = EngineConfig(model=str(tiny_llama), quantization="int8", dtype="float32",
                          speculative_config=_draft(drafts["small"]))
    draft = load_draft(config, target.config, load_tokenizer(target), torch.float32, None, 256, "float32",
                       many_tokens_from=8)
    capable = [m for m in draft.model.modules() if bf16_many_tokens_capable(m)]
    assert capable and all(m.many_tokens_from == 8 for m in capable)
