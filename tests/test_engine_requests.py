"""Request-level behaviour of the engine: sampling options, stops, n>1, bad input."""
from __future__ import annotations

import pytest
from support.engine_checks import assert_no_block_leak

from tally import LLM, SamplingParams
from tally.errors import ConfigError, InvalidRequestError, ModelLoadError


@pytest.fixture(scope="module")
def llm(tiny_model_factory):
    return LLM(str(tiny_model_factory("llama")), dtype="float32", kv_cache_memory=4_000_000, max_model_len=128)


def test_seeded_sampling_is_reproducible_and_batch_independent(llm):
    p = SamplingParams(temperature=1.0, seed=1234, max_tokens=12, ignore_eos=True)
    alone = llm.generate("Paris is", p)[0].outputs[0].token_ids
    others = [SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)] * 3
    mixed = llm.generate(["the fox", "Paris is", "hello", "print("], [others[0], p, others[1], others[2]])
    assert mixed[1].outputs[0].token_ids == alone
    assert_no_block_leak(llm)


def test_top_k_1_equals_greedy(llm):
    greedy = llm.generate("The quick", SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    topk1 = llm.generate("The quick", SamplingParams(temperature=0.8, top_k=1, max_tokens=10, ignore_eos=True))
    assert greedy[0].outputs[0].token_ids == topk1[0].outputs[0].token_ids


def test_n_samples_share_the_prompt_blocks_and_differ(llm):
    prompt = "The quick brown fox jumps over the lazy dog. " * 3
    out = llm.generate(prompt, SamplingParams(n=4, temperature=1.0, seed=7, max_tokens=8, ignore_eos=True))[0]
    assert len(out.outputs) == 4 and [o.index for o in out.outputs] == [0, 1, 2, 3]
    assert len({tuple(o.token_ids) for o in out.outputs}) > 1
    # siblings waited for the first sample's prefill and reused its full blocks
    assert out.num_cached_tokens == 0
    assert llm.engine.kv.stats.hit_tokens >= 3 * 16
    assert_no_block_leak(llm)


def test_n_samples_copy_the_prompts_last_partial_block_and_sample_as_if_they_computed_it(llm):
    """Each sibling copies the parent's partial last block and computes only the last prompt token (whose logits it
    samples from): one prompt's worth of prefill for all n, and the same samples as siblings that recompute it."""
    prompt = list(range(20, 20 + 3 * 16 + 9))
    params = SamplingParams(n=4, temperature=1.0, seed=3, max_tokens=6, ignore_eos=True)
    prefilled = llm.engine.stats.prompt_tokens
    forked = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)[0]
    assert llm.engine.stats.prompt_tokens - prefilled == len(prompt)  # the parent's prefill only
    copy_block, llm.engine.scheduler.copy_block = llm.engine.scheduler.copy_block, None
    try:
        recomputed = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)[0]
    finally:
        llm.engine.scheduler.copy_block = copy_block
    assert [o.token_ids for o in forked.outputs] == [o.token_ids for o in recomputed.outputs]
    assert len({tuple(o.token_ids) for o in forked.outputs}) > 1
    assert_no_block_leak(llm)


def test_stop_string_ends_output_and_is_not_included(llm):
    free = llm.generate("Numbers:", SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[0].outputs[0]
    assert len(free.text) > 4
    stop = free.text[2:4]
    out = llm.generate("Numbers:", SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop=[stop]))
    comp = out[0].outputs[0]
    assert comp.finish_reason == "stop" and comp.stop_reason == stop
    assert comp.text == free.text[:free.text.index(stop)]


def test_stop_token_ids_finish_with_the_token_as_reason(llm):
    free = llm.generate("hello", SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0].outputs[0]
    target = free.token_ids[3]
    out = llm.generate("hello", SamplingParams(temperature=0, max_tokens=6, ignore_eos=True,
                                               stop_token_ids=[target]))[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == target
    assert out.token_ids == free.token_ids[:free.token_ids.index(target) + 1]


def test_prompt_logprobs_score_every_prompt_token_after_the_first(llm):
    out = llm.generate("The quick brown fox", SamplingParams(max_tokens=1, prompt_logprobs=2))[0]
    assert out.prompt_logprobs[0] is None
    assert len(out.prompt_logprobs) == len(out.prompt_token_ids)
    for tid, entry in zip(out.prompt_token_ids[1:], out.prompt_logprobs[1:]):
        assert tid in entry and entry[tid].logprob <= 0


@pytest.mark.parametrize("prompt, params, fragment", [
    ("", SamplingParams(), "empty"),
    ("word " * 200, SamplingParams(), "max_model_len"),
    ("hi", SamplingParams(max_tokens=500), "max_tokens"),
    ({"prompt_token_ids": [10**6]}, SamplingParams(), "vocabulary"),
])
def test_bad_requests_fail_alone_and_the_engine_carries_on(llm, prompt, params, fragment):
    with pytest.raises(InvalidRequestError, match=fragment):
        llm.generate(prompt, params)
    ok = llm.generate("hello", SamplingParams(max_tokens=3, ignore_eos=True))
    assert len(ok[0].outputs[0].token_ids) == 3
    assert_no_block_leak(llm)


@pytest.mark.parametrize("kwargs", [dict(top_p=0.0), dict(top_p=1.5), dict(temperature=-1), dict(max_tokens=0)])
def test_invalid_sampling_params_raise_value_errors(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


def test_unknown_model_path_and_bad_config_fail_clearly(tmp_path):
    with pytest.raises(ModelLoadError):
        LLM(str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match="dtype"):
        LLM(None, dtype="float8")


def test_abort_frees_blocks_at_once(llm):
    engine = llm.engine
    engine.add_request("a", "The quick brown fox", SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    assert engine.kv.num_used_blocks() > 0
    engine.abort_request("a")
    assert engine.kv.num_used_blocks() == 0
    outs = engine.step()
    assert outs[0].finished and outs[0].outputs[0].finish_reason == "abort"
    assert_no_block_leak(llm)


def test_max_tokens_0_scores_the_prompt_and_generates_nothing(llm):
    out = llm.generate("The quick brown fox", SamplingParams(max_tokens=0, prompt_logprobs=1))[0]
    assert out.outputs[0].token_ids == [] and out.outputs[0].text == ""
    assert out.outputs[0].finish_reason == "length"
    assert len(out.prompt_logprobs) == len(out.prompt_token_ids)
    assert_no_block_leak(llm)


def test_every_sample_of_an_n_request_is_counted_running_or_waiting(tiny_llama):
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory=4_000_000, max_num_seqs=8)
    engine = llm.engine
    engine.add_request("many", "Hello there", SamplingParams(n=100, max_tokens=20, temperature=1.0, seed=0))
    for _ in range(4):
        engine.step()
        snap = engine.snapshot()
        assert snap.num_running <= 8 and snap.num_running + snap.num_waiting == 100  # first: the parent alone
    assert snap.num_running == 8
    engine.abort_request("many")
    engine.step()
    assert engine.snapshot().num_running + engine.snapshot().num_waiting == 0
    assert_no_block_leak(llm)


def test_the_snapshot_counts_prompt_and_generated_tokens(tiny_llama):
    """...and apart, the steps without a prompt chunk: both prompts are one step, which samples each one's first
    token; the other 8 come from decode steps."""
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory=4_000_000, enable_prefix_caching=False)
    llm.generate([{"prompt_token_ids": list(range(3, 23))}] * 2, SamplingParams(max_tokens=5, ignore_eos=True))
    snap = llm.engine.snapshot()
    assert (snap.prompt_tokens, snap.generated_tokens) == (40, 10)
    assert snap.decode_step_tokens == 8 and snap.decode_step_seconds > 0


def test_vllm_style_llm_arguments(tiny_llama, caplog):
    """GPU-only keywords warn instead of failing; the progress bar does not change outputs; chat takes vLLM's
    arguments; the output classes are exported."""
    from tally import CompletionOutput, RequestOutput

    with caplog.at_level("WARNING", logger="tally"):
        llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory=4_000_000, gpu_memory_utilization=0.9,
                  enforce_eager=True, tensor_parallel_size=1, pipeline_parallel_size=1)
    assert "enforce_eager, gpu_memory_utilization" in caplog.text
    prompts = [{"prompt_token_ids": list(range(3, 13 + i))} for i in range(3)]
    greedy = SamplingParams(temperature=0, max_tokens=4)
    with_bar, without = llm.generate(prompts, greedy), llm.generate(prompts, greedy, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in with_bar] == [o.outputs[0].token_ids for o in without]
    assert isinstance(with_bar[0], RequestOutput) and isinstance(with_bar[0].outputs[0], CompletionOutput)
    template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}{{ extra }}"
    out = llm.chat([{"role": "user", "content": "hi"}], greedy, chat_template=template,
                   chat_template_kwargs={"extra": "assistant:"})
    assert out[0].prompt == "user: hi\nassistant:"


def test_max_logprobs_bounds_what_a_request_may_ask_for(tiny_llama):
    """vLLM's --max-logprobs (default 20): beyond it a request is refused naming the flag."""
    strict = LLM(str(tiny_llama), dtype="float32", kv_cache_memory=4_000_000)
    with pytest.raises(InvalidRequestError, match="--max-logprobs"):
        strict.generate("hi", SamplingParams(max_tokens=1, logprobs=21), use_tqdm=False)
    wide = LLM(str(tiny_llama), dtype="float32", kv_cache_memory=4_000_000, max_logprobs=30)
    out = wide.generate("hi", SamplingParams(max_tokens=2, logprobs=25), use_tqdm=False)[0].outputs[0]
    assert all(len(entry) >= 25 for entry in out.logprobs)


def test_bad_words_never_appear_and_change_nothing_else(tiny_llama):
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory=4_000_000)
    tok = llm.get_tokenizer()
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    plain = llm.generate("the quick brown fox", greedy, use_tqdm=False)[0].outputs[0]
    word = next(w for w in (tok.decode([t]).strip() for t in plain.token_ids) if w.isalpha() and len(w) > 1)
    banned = {tuple(tok.encode(form, add_special_tokens=False)) for form in (word, " " + word)}
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, bad_words=[word])
    out = llm.generate("the quick brown fox", params, use_tqdm=False)[0].outputs[0].token_ids
    assert out != plain.token_ids
    for seq in banned:
        assert not any(tuple(out[i:i + len(seq)]) == seq for i in range(len(out))), (word, seq, out)
    first = next(i for i, (a, b) in enumerate(zip(out, plain.token_ids)) if a != b)
    assert out[:first] == plain.token_ids[:first]  # the same text up to the word
