"""Tensor parallelism on torch.distributed (gloo): two real processes on this machine give the greedy tokens of one,
on every tiny architecture and the built-in model, batched with chunked prefill, prefix hits and preemption, and
with partial sums (batch_invariant off) too; the ledger's per-rank figures are the plan's; a rank that dies fails the
engine cleanly; a bad size is refused. Bitwise logprobs: tests/test_parallel_invariance.py."""
from __future__ import annotations

import contextlib
import io
import json
import threading

import pytest
from support.tiny_models import ARCH_CONFIGS

from tally import LLM, SamplingParams
from tally.cli import main as tally_main
from tally.engine.config import EngineConfig
from tally.engine.parallel.distributed import is_follower
from tally.errors import ConfigError, EngineDeadError
from tally.layers.parallel import RowParallel
from tally.models.config import ModelConfig
from tally.models.registry import resolve_model
from tally.models.tensor_parallel import plan_shards
from tally.quantize.layer import QuantizeOptions
from tally.quantize.pipeline import QuantizeJob, run
from tally.quantize.scheme import parse_scheme

GREEDY = SamplingParams(temperature=0, max_tokens=12)
SHARED = "In a paged KV cache, blocks of tokens are shared between requests with a common prefix. " * 2
PROMPTS = [SHARED + "The quick brown fox", SHARED + "def add(a, b):", "Paris is the capital", SHARED + "Numbers: 0 1"]
# Small steps (chunked prefill) and a pool of a few blocks (preemption), so every scheduling path runs under TP.
BUSY = dict(max_num_batched_tokens=24, num_gpu_blocks_override=8, max_model_len=128)
BUILTIN_DENSE = dict(dtype="float32", quantization="none", max_model_len=256, kv_cache_memory=64 * 2**20)


def _tokens(llm: LLM, prompts: list[str], params: SamplingParams = GREEDY) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]


@contextlib.contextmanager
def _tp_llm(model: str | None, **kwargs):
    llm = LLM(model, tensor_parallel_size=2, **kwargs)
    try:
        yield llm
    finally:
        llm.engine.shutdown()


def _config(heads: int, kv: int, intermediate: int = 128, vocab: int = 100) -> ModelConfig:
    return ModelConfig(architecture="llama", vocab_size=vocab, hidden_size=64,
                       intermediate_size=intermediate, num_layers=2, num_heads=heads, num_kv_heads=kv, head_dim=16,
                       max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=10000.0,
                       tie_word_embeddings=False)


def test_heads_split_by_whole_kv_groups_and_rank_0_holds_the_most():
    first, second = plan_shards(_config(heads=9, kv=3, intermediate=1536, vocab=49152), 2)
    assert (first.kv_heads, first.q_heads) == ((0, 2), (0, 6))
    assert (second.kv_heads, second.q_heads) == ((2, 3), (6, 9))
    assert first.intermediate == (0, 768) and second.intermediate == (768, 1536)
    assert first.vocab == (0, 24576) and first.vocab_rows == 24576


def test_fewer_kv_heads_than_ranks_replicates_them():
    shards = plan_shards(_config(heads=4, kv=1), 2)
    assert [s.kv_heads for s in shards] == [(0, 1), (0, 1)]
    assert [s.q_heads for s in shards] == [(0, 2), (2, 4)]


def test_a_size_that_cannot_split_the_heads_is_refused_with_the_sizes_that_can():
    with pytest.raises(ConfigError, match=r"choose tensor_parallel_size from \[1, 2, 4\]"):
        plan_shards(_config(heads=4, kv=2), 3)


def test_rank_variables_without_a_split_do_not_make_a_follower(monkeypatch):
    """A pod of some training job may carry RANK / WORLD_SIZE: without a split to join, the process still serves."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert not is_follower(EngineConfig())
    assert is_follower(EngineConfig(tensor_parallel_size=2))
    monkeypatch.setenv("RANK", "0")
    assert not is_follower(EngineConfig(tensor_parallel_size=2))


def test_llm_refuses_a_bad_size_before_starting_any_process(tiny_llama):
    with pytest.raises(ConfigError, match="tensor_parallel_size 3"):
        LLM(str(tiny_llama), tensor_parallel_size=3)
    with pytest.raises(ConfigError, match="tensor_parallel_size must be ≥ 1"):
        LLM(str(tiny_llama), tensor_parallel_size=0)


@pytest.mark.parametrize("arch", sorted(ARCH_CONFIGS))
def test_two_ranks_give_the_greedy_tokens_of_one(arch, tiny_model_factory):
    ckpt = str(tiny_model_factory(arch))
    expected = _tokens(LLM(ckpt, **BUSY), PROMPTS)
    with _tp_llm(ckpt, **BUSY) as llm:
        assert _tokens(llm, PROMPTS) == expected
        snap = llm.engine.snapshot()
        assert snap.prefix_hit_tokens > 0  # the shared prefix was reused on every rank's cache
        if "sliding_window" not in ARCH_CONFIGS[arch]:  # a window gives blocks back as it slides
            assert snap.num_preemptions > 0  # the pool was small enough to preempt


@pytest.mark.parametrize(("family", "batch_invariant"), [("qwen3_moe", False), ("gpt_oss", True)])
def test_experts_on_two_ranks_give_the_greedy_tokens_of_one(family, batch_invariant, tmp_path):
    """By default every rank holds the experts whole and o_proj's bias is split with its rows; with partial sums
    (batch_invariant off) each expert's gate/up by columns and down by the same columns, the router on every rank,
    the row-parallel biases (o_proj's, each expert's down's) added by one rank. GPT-OSS's sinks by query heads."""
    from support.families import make_family_checkpoint

    ckpt = str(make_family_checkpoint(tmp_path / family, family, **{
        "qwen3_moe": dict(moe_intermediate_size=64), "gpt_oss": dict(intermediate_size=64)}[family]))
    kw = dict(dtype="float32", max_model_len=128, kv_cache_memory=4_000_000, batch_invariant=batch_invariant)
    expected = _tokens(LLM(ckpt, **kw), PROMPTS)
    with _tp_llm(ckpt, **kw) as llm:
        down = llm.engine.model.layers[0].experts.down[0]  # fp32 panels where the native kernels build, else dense
        shape = (down.out_features, down.in_features) if hasattr(down, "panels") else tuple(down.weight.shape)
        assert shape == (64, 64 if batch_invariant else 32)  # all 64 columns, or this rank's half
        assert isinstance(llm.engine.model.layers[0].o_proj, RowParallel) != batch_invariant
        assert _tokens(llm, PROMPTS) == expected


@pytest.mark.parametrize("scheme", ["w4a16-g32", "w8a16", "awq"])
def test_stored_integers_split_like_their_weights(scheme, tiny_llama, tmp_path):
    """A `tally quantize` checkpoint (packed int4 with group scales, int8 with per-channel scales) and an AWQ one:
    each rank loads only its rows / columns of the stored integers, and the tokens are one process's."""
    if scheme == "awq":
        from test_quant_hf_layout import write_pair

        ckpt, _ = write_pair(tiny_llama, tmp_path, "awq")
    else:
        ckpt = run(QuantizeJob(str(tiny_llama), tmp_path / "q", QuantizeOptions(parse_scheme(scheme), "rtn"))).out
    expected = _tokens(LLM(str(ckpt), dtype="float32"), PROMPTS)
    with _tp_llm(str(ckpt), dtype="float32") as llm:
        assert llm.engine.model.layers[0].o_proj.inner.scheme == ("int8" if scheme == "w8a16" else "int4")
        assert _tokens(llm, PROMPTS) == expected


def test_a_group_that_straddles_two_ranks_loads_unless_partial_sums_cut_it(tiny_llama, tmp_path):
    """o_proj and down_proj split by their outputs keep every group whole; split by their inputs they may not."""
    ckpt = run(QuantizeJob(str(tiny_llama), tmp_path / "q", QuantizeOptions(parse_scheme("w4a16-g128"), "rtn"))).out
    with pytest.raises(ConfigError, match="cut one"):  # down_proj's 128 inputs are one group; each rank has 64
        LLM(str(ckpt), tensor_parallel_size=2, batch_invariant=False)
    expected = _tokens(LLM(str(ckpt)), PROMPTS[:1])  # the ranks it started are gone and this process is whole again
    with _tp_llm(str(ckpt)) as llm:
        assert _tokens(llm, PROMPTS[:1]) == expected


@pytest.fixture(scope="class")
def builtin_dense_tp():
    """SmolLM2 on two ranks, fp32 dense, for the tests of one class: each rank loads the model, and no other split
    may run beside it (one process group per process)."""
    with _tp_llm(None, **BUILTIN_DENSE) as llm:
        yield llm


class TestBuiltinModelDense:
    """SmolLM2 on two ranks, fp32 dense (exact)."""

    def test_uneven_heads_match_one_process(self, builtin_dense_tp):
        """9 heads in 3 KV groups, split 6 + 3."""
        prompts = ["The capital of France is", "def fibonacci(n):"]
        assert _tokens(builtin_dense_tp, prompts) == _tokens(LLM(None, **BUILTIN_DENSE), prompts)

    def test_each_rank_holds_and_talks_what_the_plan_says(self, builtin_dense_tp):
        """Weights, KV and communication buffers per rank, and the collectives a step makes (each one a link
        latency in the plan's communication time)."""
        gguf = str(resolve_model(None).path)
        llm = builtin_dense_tp
        ledger = llm.engine.ledger
        first, second = ledger.ranks
        tp = llm.engine.model.tp
        calls0, steps0 = tp.comm_calls, llm.engine.snapshot().num_steps
        _tokens(llm, ["The capital of France is"])
        calls_per_step = (tp.comm_calls - calls0) / (llm.engine.snapshot().num_steps - steps0)
        batched_tokens = llm.engine.config.max_num_batched_tokens
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert tally_main(["plan", "--model", gguf, "--weights", "dense", "--dtype", "fp32", "--kv-cache-dtype",
                               "fp32", "--max-model-len", "256", "--memory", "8GiB", "--bandwidth", "50GB/s",
                               "--flops", "100G", "-tp", "2", "--link", "pcie4", "--max-num-batched-tokens",
                               str(batched_tokens), "--json"]) == 0
        plan = json.loads(buf.getvalue())
        planned = plan["weights"]["per_device_bytes"]
        assert abs(first["weight_bytes"] - planned) / planned < 0.01
        assert second["weight_bytes"] < first["weight_bytes"]  # 3 of 9 heads against 6
        assert ledger.kv_pool_bytes == ledger.kv_blocks * plan["kv"]["bytes_per_block_per_device"]
        assert second["kv_pool_bytes"] * 2 == first["kv_pool_bytes"]  # 1 KV head against 2, same blocks
        assert first["comm_buffer_bytes"] == plan["split"]["activation_buffer_bytes"] > 0
        assert calls_per_step == plan["comm_one"]["collectives"] == 4 * 30 + 2  # SmolLM2's 30 layers


def test_a_rank_that_dies_fails_the_engine_instead_of_hanging(tiny_llama):
    with _tp_llm(str(tiny_llama)) as llm:
        follower = llm.engine.parallel.followers[0]
        follower.kill()
        follower.wait(30)
        failure: list[BaseException] = []

        def run() -> None:
            try:
                _tokens(llm, ["The quick brown fox"])
            except BaseException as exc:  # noqa: BLE001 - the test reads it
                failure.append(exc)

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        worker.join(120)
        assert not worker.is_alive(), "the engine hung on a dead rank"
        assert failure and isinstance(failure[0], EngineDeadError), failure
