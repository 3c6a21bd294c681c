"""The needle test, as vLLM runs it: a greedy request alone, then at a random place among many random prompts of mixed
lengths, gives bitwise the same tokens and logprobs, at default settings and with chunked prefill, preemption,
speculation; on a dense bf16 checkpoint, tiny models of several families and the built-in model through a real
server. And the test can fail: a kernel that splits its sums by the row count is caught."""
from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from support.families import make_family_checkpoint
from support.servers import started
from support.tiny_models import make_checkpoint

from tally import LLM, SamplingParams
from tally.native import ops as native
from tally.server.process import ServerProcess

NEEDLE_PARAMS = SamplingParams(temperature=0, max_tokens=10, logprobs=0, ignore_eos=True)


def _as_bf16(model_dir: Path) -> Path:
    """The checkpoint's weights stored in bf16, as most Hugging Face checkpoints ship (fp32 compute over fp16 panels
    on CPUs without fast bf16: tally/engine/config.py path_candidates)."""
    weights = model_dir / "model.safetensors"
    save_file({k: v.bfloat16() for k, v in load_file(weights).items()}, weights, metadata={"format": "pt"})
    config = json.loads((model_dir / "config.json").read_text())
    config["torch_dtype"] = config["dtype"] = "bfloat16"
    (model_dir / "config.json").write_text(json.dumps(config))
    return model_dir


def _chosen(output) -> tuple[list[int], list[float]]:
    return list(output.token_ids), [lp[t].logprob for lp, t in zip(output.logprobs, output.token_ids)]


def _needle_misses(llm: LLM, trials: int, seed: int = 0, vocab: int = 300,
                   alone: tuple[list[int], list[float]] | None = None) -> list[int]:
    """The trials in which the needle among 32-64 others differs from it alone (`alone`: from another engine)."""
    rng = random.Random(seed)
    needle = [rng.randrange(3, vocab) for _ in range(24)]
    alone = alone or _needle_alone(llm, needle)
    misses = []
    for trial in range(trials):
        others = [[rng.randrange(3, vocab) for _ in range(rng.randrange(1, 100))] for _ in range(rng.randrange(32, 65))]
        place = rng.randrange(len(others) + 1)
        prompts = [{"prompt_token_ids": p} for p in others[:place] + [needle] + others[place:]]
        each = [SamplingParams(temperature=0, max_tokens=rng.randrange(2, 16), ignore_eos=True) for _ in others]
        outs = llm.generate(prompts, each[:place] + [NEEDLE_PARAMS] + each[place:], use_tqdm=False)
        if _chosen(outs[place].outputs[0]) != alone:
            misses.append(trial)
    return misses


@pytest.fixture(scope="module")
def dense_bf16(tmp_path_factory) -> Path:
    return _as_bf16(make_checkpoint(tmp_path_factory.mktemp("bf16"), "llama", hidden_size=128, intermediate_size=256,
                                    num_attention_heads=8, num_key_value_heads=4))


@pytest.fixture(scope="module")
def default_llm(dense_bf16: Path) -> LLM:
    return LLM(str(dense_bf16))


def test_a_dense_bf16_request_gets_its_own_bits_among_many(default_llm: LLM) -> None:
    assert _needle_misses(default_llm, trials=5) == []


def test_seeded_sampling_draws_the_same_tokens_alone_and_in_a_batch(default_llm: LLM) -> None:
    rng = random.Random(3)
    needle = [rng.randrange(3, 300) for _ in range(20)]
    seeded = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=1234, max_tokens=12, ignore_eos=True,
                            logprobs=0)
    alone = _chosen(default_llm.generate([{"prompt_token_ids": needle}], seeded, use_tqdm=False)[0].outputs[0])
    others = [[rng.randrange(3, 300) for _ in range(rng.randrange(1, 60))] for _ in range(31)]
    each = [SamplingParams(temperature=1.0, seed=i if i % 2 else None, max_tokens=8, ignore_eos=True)
            for i in range(31)]
    outs = default_llm.generate([{"prompt_token_ids": p} for p in others[:9] + [needle] + others[9:]],
                                each[:9] + [seeded] + each[9:], use_tqdm=False)
    assert _chosen(outs[9].outputs[0]) == alone


@pytest.mark.parametrize("settings", [
    dict(max_num_batched_tokens=16, enable_chunked_prefill=True),
    dict(speculative_config={"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}),
], ids=["chunked-prefill-16", "ngram-speculation"])
def test_settings_that_reshape_steps_leave_a_requests_bits_alone(dense_bf16: Path, default_llm: LLM,
                                                                   settings: dict) -> None:
    """Against the needle alone at default settings: small prompt chunks, speculation on (preemption: below)."""
    needle_alone = _needle_alone(default_llm)
    llm = LLM(str(dense_bf16), **settings)
    try:
        assert _needle_misses(llm, trials=1, alone=needle_alone) == []
    finally:
        llm.engine.shutdown()


# A pool of 24 blocks of 4 tokens for a 24-token needle behind two requests of 30 + 60 tokens: the newest running,
# the needle is preempted when the pool runs out, tokens into its output (and again later).
MID_DECODE_POOL = dict(num_gpu_blocks_override=24, block_size=4, max_model_len=96)
MID_DECODE_PARAMS = SamplingParams(temperature=0, max_tokens=16, logprobs=0, ignore_eos=True)


def _mid_decode_needle() -> list[int]:
    rng = random.Random(11)
    return [rng.randrange(3, 300) for _ in range(24)]


def _needle_preempted_mid_decode(llm: LLM) -> tuple[tuple[list[int], list[float]], list[int]]:
    """The needle behind two long requests in MID_DECODE_POOL: its tokens and logprobs, and how many tokens it had
    generated at each of its preemptions."""
    rng = random.Random(12)
    engine, long = llm.engine, SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    for i in range(2):
        engine.add_request(f"long-{i}", {"prompt_token_ids": [rng.randrange(3, 300) for _ in range(30)]}, long)
    engine.add_request("needle", {"prompt_token_ids": _mid_decode_needle()}, MID_DECODE_PARAMS)
    made, final = [], {}
    while engine.has_unfinished_requests():
        waited = any(r.request_id == "needle" for r in engine.scheduler.waiting)
        for out in engine.step():
            final[out.request_id] = out
        made += [r.num_output_tokens for r in engine.scheduler.waiting if r.request_id == "needle" and not waited]
    return _chosen(final["needle"].outputs[0]), made


def _alone_mid_decode(model: str, **settings) -> tuple[list[int], list[float]]:
    """_needle_preempted_mid_decode's needle alone, at default settings but MID_DECODE_POOL's context length (an int8
    cache's key scales are measured over it) and `settings`."""
    llm = LLM(model, max_model_len=MID_DECODE_POOL["max_model_len"], **settings)
    try:
        out = llm.generate([{"prompt_token_ids": _mid_decode_needle()}], MID_DECODE_PARAMS, use_tqdm=False)[0]
        return _chosen(out.outputs[0])
    finally:
        llm.engine.shutdown()


def _assert_preempted_mid_decode_keeps_its_bits(model: str, **settings) -> None:
    alone = _alone_mid_decode(model, kv_cache_dtype=settings.get("kv_cache_dtype", "auto"))
    llm = LLM(model, **MID_DECODE_POOL, **settings)
    try:
        got, made = _needle_preempted_mid_decode(llm)
    finally:
        llm.engine.shutdown()
    assert max(made, default=0) >= 3  # preempted with tokens generated
    assert got == alone


@pytest.fixture(scope="module")
def dense_fp32(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("fp32"), "llama", hidden_size=128, intermediate_size=256,
                           num_attention_heads=8, num_key_value_heads=4)


@pytest.mark.parametrize("settings", [
    dict(preemption_mode="recompute", enable_prefix_caching=False),
    dict(preemption_mode="recompute"),
    dict(preemption_mode="recompute", enable_prefix_caching=False, max_num_batched_tokens=8),
    dict(preemption_mode="recompute", enable_prefix_caching=False, kv_cache_dtype="int8"),
    dict(preemption_mode="swap", swap_space=1),
    dict(preemption_mode="recompute", enable_prefix_caching=False, tensor_parallel_size=2),
    dict(preemption_mode="recompute", enable_prefix_caching=False, pipeline_parallel_size=2),
], ids=["recompute", "recompute-prefix-hits", "recompute-chunked-8", "recompute-int8-kv", "swap", "recompute-tp2",
        "recompute-pp2"])
def test_a_request_preempted_mid_decode_keeps_its_bits_on_an_fp32_checkpoint(dense_fp32: Path,
                                                                             settings: dict) -> None:
    """Recompute runs the generated tokens as the decode rows that first made them, after the prompt's prefill: the
    same tokens and logprobs as alone (in one process), whether the recompute runs whole, in 8-token chunks, after
    prefix-cache hits on the request's own blocks, over an int8 cache, or on two tensor or pipeline ranks (rank 0's
    layout sent to the others); swapped blocks come back as they were."""
    _assert_preempted_mid_decode_keeps_its_bits(str(dense_fp32), **settings)


def test_a_request_preempted_mid_decode_keeps_its_bits_under_sliding_windows(tmp_path: Path) -> None:
    """Gemma 3's windows of 8 keys on some layers: a recomputed decode row sees the window it saw."""
    _assert_preempted_mid_decode_keeps_its_bits(str(make_family_checkpoint(tmp_path, "gemma3")),
                                                preemption_mode="recompute", enable_prefix_caching=False)


def test_a_request_preempted_mid_decode_keeps_its_bits_on_the_built_in_gguf() -> None:
    """The built-in model (its GGUF blocks on the native kernels, the one-call decode step), recomputed."""
    _assert_preempted_mid_decode_keeps_its_bits("smollm2-135m", preemption_mode="recompute",
                                                enable_prefix_caching=False)


def test_a_needle_on_two_tensor_parallel_ranks_gets_one_process_bits(dense_bf16: Path, default_llm: LLM) -> None:
    llm = LLM(str(dense_bf16), tensor_parallel_size=2)
    try:
        assert _needle_misses(llm, trials=1, alone=_needle_alone(default_llm)) == []
    finally:
        llm.engine.shutdown()


@pytest.mark.parametrize("model", ["dense-bf16", "smollm2-135m"])
def test_a_next_turn_holding_the_last_answer_gets_the_bits_of_a_cache_miss(dense_bf16: Path, model: str) -> None:
    """The answer's KV was made by decode rows; the next turn's prompt computes it as prompt rows (on the built-in
    model's integer kernels the two differed by 0.1-0.2 in logprobs), so only prompt blocks are reused."""
    model = str(dense_bf16) if model == "dense-bf16" else model
    rng = random.Random(5)
    first = [rng.randrange(3, 300) for _ in range(40)]
    answer_params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    llm = LLM(model, max_model_len=256)
    answer = list(llm.generate([{"prompt_token_ids": first}], answer_params, use_tqdm=False)[0].outputs[0].token_ids)
    next_turn = [{"prompt_token_ids": first + answer + [rng.randrange(3, 300) for _ in range(5)]}]
    after = llm.generate(next_turn, NEEDLE_PARAMS, use_tqdm=False)[0]
    assert after.num_cached_tokens >= 32  # the first prompt's blocks were reused
    miss = LLM(model, max_model_len=256, enable_prefix_caching=False)
    try:
        assert _chosen(after.outputs[0]) == _chosen(miss.generate(next_turn, NEEDLE_PARAMS, use_tqdm=False)[0].outputs[0])
    finally:
        for engine in (llm, miss):
            engine.engine.shutdown()


@pytest.mark.parametrize("settings", [{"dtype": "bfloat16"}, {"kv_cache_dtype": "int8"}], ids=["bf16", "int8_kv"])
def test_a_dense_model_in_bf16_or_over_an_int8_cache_gets_its_own_bits_among_many_chunked_or_not(
        dense_bf16: Path, settings: dict) -> None:
    """`--dtype bfloat16`: projections on the native bf16 panels (tally/layers/dense.py Bf16PanelLinear), attention
    on the fp32 kernels over the bf16 cache. `--kv-cache-dtype int8`: each token's K and V quantized on its own
    scales (tally/attention/kv_cache.py) and read by one native kernel a row, in decode-only, mixed and chunked steps
    alike. Prompts in one pass or in 16-token chunks; the needle's later trials hit the prefix cache."""
    llm = LLM(str(dense_bf16), **settings)
    try:
        assert _needle_misses(llm, trials=2) == []
        alone = _needle_alone(llm)
    finally:
        llm.engine.shutdown()
    chunked = LLM(str(dense_bf16), **settings, max_num_batched_tokens=16, enable_chunked_prefill=True)
    try:
        assert _needle_misses(chunked, trials=1, alone=alone) == []
    finally:
        chunked.engine.shutdown()


def _needle_alone(llm: LLM, needle: list[int] | None = None) -> tuple[list[int], list[float]]:
    """The needle's tokens and logprobs run alone (default: _needle_misses' needle at its default seed)."""
    if needle is None:
        rng = random.Random(0)
        needle = [rng.randrange(3, 300) for _ in range(24)]
    return _chosen(llm.generate([{"prompt_token_ids": needle}], NEEDLE_PARAMS, use_tqdm=False)[0].outputs[0])


# sliding windows, LongRoPE over part of each head, tied embeddings, experts (the router), soft-capped scores and
# attention sinks (whose prompts must also keep their bits split into 16-token chunks)
@pytest.mark.parametrize("family", ["llama3", "gemma3", "phi3", "mixtral", "gemma2", "gpt_oss"])
def test_a_tiny_model_of_each_family_gets_its_own_bits_among_many(family: str, tmp_path: Path) -> None:
    model_dir = _as_bf16(make_family_checkpoint(tmp_path, family))
    llm = LLM(str(model_dir))
    try:
        assert _needle_misses(llm, trials=1) == []
        alone = _needle_alone(llm)
    finally:
        llm.engine.shutdown()
    if family in ("gemma2", "gpt_oss"):
        chunked = LLM(str(model_dir), max_num_batched_tokens=16, enable_chunked_prefill=True)
        try:
            assert _needle_misses(chunked, trials=1, alone=alone) == []
        finally:
            chunked.engine.shutdown()


@pytest.mark.parametrize("family", ["gemma2", "gpt_oss"])
def test_a_soft_capped_or_sink_weighted_prompt_keeps_its_bits_whole_chunked_and_after_a_cached_prefix(
        family: str, tmp_path: Path) -> None:
    """Their prompts run through the native prefill kernel (windows of 8 keys, inside its tiles of 16): whole, in
    16-token chunks (33 tokens: a last chunk of one token) and after 32 cached tokens (one token left, or 8), the same
    tokens and logprobs."""
    model_dir = make_family_checkpoint(tmp_path, family)
    rng = random.Random(5)
    prompts = [[rng.randrange(3, 300) for _ in range(n)] for n in (33, 40)]
    prompts[1][:32] = prompts[0][:32]
    llm = LLM(str(model_dir), enable_prefix_caching=False)
    try:
        whole = [_chosen(o.outputs[0]) for o in llm.generate([{"prompt_token_ids": p} for p in prompts],
                                                             NEEDLE_PARAMS, use_tqdm=False)]
    finally:
        llm.engine.shutdown()
    cached = LLM(str(model_dir))
    chunked = LLM(str(model_dir), max_num_batched_tokens=16, enable_chunked_prefill=True, enable_prefix_caching=False)
    try:
        for engine in (cached, chunked):
            for prompt, want in zip(prompts, whole):  # one at a time: the second hits the first's 32 tokens
                out = engine.generate([{"prompt_token_ids": prompt}], NEEDLE_PARAMS, use_tqdm=False)[0]
                assert _chosen(out.outputs[0]) == want
        assert cached.engine.kv.stats.hit_tokens == 32
    finally:
        cached.engine.shutdown()
        chunked.engine.shutdown()


def test_an_fp32_checkpoint_gets_its_own_bits_among_many(tmp_path: Path) -> None:
    """fp32 weights run on the native panels (tally/layers/dense.py Fp32PanelLinear), not PyTorch's BLAS."""
    llm = LLM(str(make_checkpoint(tmp_path, "llama", hidden_size=128, intermediate_size=256, num_attention_heads=8,
                                  num_key_value_heads=4)))
    try:
        assert _needle_misses(llm, trials=2) == []
    finally:
        llm.engine.shutdown()


def test_without_the_native_kernels_start_up_warns_that_the_guarantee_cannot_hold(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """PyTorch's fp32 matmul sums by the row count (docs/server.md#reproducibility): the guarantee needs the kernels."""
    from tally.engine.config import EngineConfig
    from tally.engine.startup import load

    monkeypatch.setattr(load.native, "available", lambda: False)
    assert "TALLY_NATIVE=0" in load.batch_invariance_caveat(EngineConfig())
    assert load.batch_invariance_caveat(EngineConfig(batch_invariant=False)) is None
    monkeypatch.undo()
    assert native.available() == (load.batch_invariance_caveat(EngineConfig()) is None)


@pytest.mark.skipif(not native.available(), reason="the fp16 panels' kernel is native")
def test_a_kernel_that_splits_its_sums_by_the_row_count_is_caught(dense_bf16: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The inverse test: with a deliberately row-count-dependent matmul (split-K where the row count says, as a BLAS
    picks its blocking by shape), the needle check must see a difference, so its passing above means something.
    An engine of its own: the damaged kernel's cache blocks must not serve the other tests."""
    honest = native.gemm_f16

    def split_k(x: torch.Tensor, panels: torch.Tensor, n: int, bias: torch.Tensor | None,
                out: torch.Tensor | None = None) -> torch.Tensor:
        cut = 16 * (1 + x.shape[0] % 3)
        y = honest(x[:, :cut].contiguous(), panels[:, :cut].contiguous(), n, bias)
        y += honest(x[:, cut:].contiguous(), panels[:, cut:].contiguous(), n, None)
        return y if out is None else out.add_(y)

    monkeypatch.setattr(native, "gemm_f16", split_k)
    llm = LLM(str(dense_bf16), enable_prefix_caching=False)
    try:
        assert _needle_misses(llm, trials=2) != []
    finally:
        llm.engine.shutdown()


def test_the_built_in_model_through_the_server_gives_a_request_its_own_bits() -> None:
    """Default settings, the official client, requests in flight together: the needle's logprobs alone and among 32
    others are the same floats as JSON carries them."""
    import openai

    rng = random.Random(57)
    words = "the of and to in is was for on that with as by at from it an be this are".split()
    needle = " ".join(rng.choice(words) for _ in range(30))
    others = [" ".join(rng.choice(words) for _ in range(rng.randrange(2, 60))) for _ in range(32)]
    with started(ServerProcess([])) as (server,):
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none")

        def complete(prompt: str, max_tokens: int) -> list[float]:
            r = client.completions.create(model="smollm2-135m", prompt=prompt, max_tokens=max_tokens, temperature=0,
                                          logprobs=0)
            return r.choices[0].logprobs.token_logprobs

        alone = complete(needle, 6)
        with ThreadPoolExecutor(len(others) + 1) as pool:
            place = rng.randrange(len(others) + 1)
            futures = [pool.submit(complete, p, rng.randrange(1, 6)) for p in others[:place]]
            mine = pool.submit(complete, needle, 6)
            futures += [pool.submit(complete, p, rng.randrange(1, 6)) for p in others[place:]]
            assert mine.result() == alone
            for f in futures:
                f.result()
