"""Pipeline parallelism on torch.distributed (gloo): two stages (and two stages of two TP ranks) in real processes
give the greedy tokens of one process on every tiny architecture and the built-in model, batched with chunked
prefill, prefix hits and preemption; each stage holds what `tally plan -pp` says; a stage that dies fails the
engine cleanly; more stages than layers is refused."""
from __future__ import annotations

import contextlib
import io
import json
import threading
import time

import pytest
import torch
from support.tiny_models import ARCH_CONFIGS
from test_tensor_parallel import BUSY, PROMPTS, _tokens

from tally import LLM, SamplingParams
from tally.attention.metadata import AttentionMetadata
from tally.cli import main as tally_main
from tally.engine.model_step import ModelStep
from tally.engine.parallel.pipeline import read_clock, split_step, write_clock
from tally.errors import ConfigError, EngineDeadError
from tally.models.config import ModelConfig
from tally.models.pipeline_split import plan_stages, stage_of_layer
from tally.models.registry import resolve_model

BUILTIN = dict(dtype="float32", quantization="none", max_model_len=256, kv_cache_memory=64 * 2**20)


@contextlib.contextmanager
def _parallel_llm(model: str | None, **kwargs):
    llm = LLM(model, **kwargs)
    try:
        yield llm
    finally:
        llm.engine.shutdown()


def test_stages_are_contiguous_runs_of_layers_and_stage_0_holds_the_most():
    cfg = ModelConfig(architecture="llama", vocab_size=100, hidden_size=64, intermediate_size=128, num_layers=30,
                      num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-6,
                      rope_theta=10000.0, tie_word_embeddings=True)
    stages = plan_stages(cfg, 4)
    assert [s.layers for s in stages] == [(0, 8), (8, 15), (15, 23), (23, 30)]
    assert all(stage_of_layer(i, 30, 4) == s.stage for s in stages for i in range(*s.layers))
    first, last = stages[0], stages[-1]
    assert first.holds("model.embed_tokens.weight") and last.holds("model.embed_tokens.weight")  # tied: a copy
    assert last.holds("model.norm.weight") and not first.holds("model.norm.weight")
    assert first.holds("model.layers.7.mlp.up_proj.weight") and not first.holds("model.layers.8.mlp.up_proj.weight")


def test_micro_batches_keep_decodes_first_and_put_every_logit_row_back():
    # 3 decodes, then prompts of 5 and 4 tokens; logit rows: a prompt-logprob span, then each sampled position
    starts = [0, 1, 2, 3, 8, 12]
    meta = AttentionMetadata(query_start_loc=starts, context_lens=[4, 6, 9, 5, 4],
                             block_tables=torch.arange(10).view(5, 2), slot_mapping=torch.arange(12), block_size=16,
                             num_decode_tokens=3)
    rows = torch.tensor([3, 4, 5, 0, 1, 2, 7, 11])
    step = ModelStep(torch.arange(100, 112), torch.arange(12), meta, rows)
    batches = split_step(step, 2)
    assert [b.step.meta.num_seqs for b in batches] == [4, 1]  # cut at the first sequence boundary past 12 / 2
    assert [b.step.meta.num_decode_tokens for b in batches] == [3, 0]
    assert batches[1].step.meta.query_start_loc == [0, 4]
    assert torch.equal(batches[1].step.meta.block_tables, meta.block_tables[4:])
    assert torch.equal(torch.cat([b.step.input_ids for b in batches]), step.input_ids)
    placed = torch.full((len(rows),), -1)
    for b in batches:
        first_row = b.step.meta.slot_mapping[0]  # the micro-batch's first row in the step (slots are 0..11 here)
        placed[b.logit_index] = b.step.logit_rows + first_row
    assert torch.equal(placed, rows)
    many = split_step(step, 8)  # more stages than sequences: no micro-batch is empty
    assert all(b.step.meta.num_seqs for b in many) and sum(b.step.meta.num_seqs for b in many) == 5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_clock_row_carries_two_float64s_through_any_activation_dtype(dtype):
    buf = torch.randn(4, 9, dtype=torch.float32).to(dtype)  # odd width: the last row starts unaligned for float64
    write_clock(buf[-1], 123456.789012345, 0.00042)
    assert read_clock(buf.clone()[-1]) == (123456.789012345, 0.00042)


def test_more_stages_than_layers_is_refused_before_any_process_starts(tiny_llama):
    with pytest.raises(ConfigError, match="3 pipeline stages cannot split the model's 2 layers"):
        LLM(str(tiny_llama), pipeline_parallel_size=3)
    with pytest.raises(ConfigError, match="pipeline_parallel_size must be ≥ 1"):
        LLM(str(tiny_llama), pipeline_parallel_size=0)
    with pytest.raises(ConfigError, match="kv_cache_dtype int8"):
        LLM(str(tiny_llama), pipeline_parallel_size=2, kv_cache_dtype="int8")


@pytest.mark.parametrize("arch", sorted(ARCH_CONFIGS))
def test_two_stages_give_the_greedy_tokens_of_one(arch, tiny_model_factory):
    ckpt = str(tiny_model_factory(arch))
    expected = _tokens(LLM(ckpt, **BUSY), PROMPTS)
    with _parallel_llm(ckpt, pipeline_parallel_size=2, **BUSY) as llm:
        assert _tokens(llm, PROMPTS) == expected
        snap = llm.engine.snapshot()
        assert snap.prefix_hit_tokens > 0  # the shared prefix was reused in both stages' caches
        if "sliding_window" not in ARCH_CONFIGS[arch]:  # a window gives blocks back as it slides
            assert snap.num_preemptions > 0


def test_two_stages_of_two_tensor_parallel_ranks_match_one_process(tiny_llama):
    """Four processes; prompt logprobs too, so logit rows of prompts and of samples cross micro-batches."""
    params = SamplingParams(temperature=0, max_tokens=8, prompt_logprobs=1)
    one = LLM(str(tiny_llama), **BUSY).generate(PROMPTS, params, use_tqdm=False)
    with _parallel_llm(str(tiny_llama), tensor_parallel_size=2, pipeline_parallel_size=2, **BUSY) as llm:
        four = llm.generate(PROMPTS, params, use_tqdm=False)
        assert llm.engine.parallel.pipe.clock.seconds > 0  # rank 0 holds the boundaries' transfer time
        assert [(r["stage"], r["layers"]) for r in llm.engine.ledger.ranks] == [
            (0, [0, 1]), (0, [0, 1]), (1, [1, 2]), (1, [1, 2])]
    assert [o.outputs[0].token_ids for o in four] == [o.outputs[0].token_ids for o in one]
    for a, b in zip(one, four):
        for pa, pb in zip(a.prompt_logprobs[1:], b.prompt_logprobs[1:]):
            assert pa.keys() == pb.keys()
            assert all(abs(pa[t].logprob - pb[t].logprob) < 1e-4 for t in pa)


def test_builtin_model_in_two_stages_matches_one_process_and_holds_what_the_plan_says():
    """SmolLM2's 30 layers as 15 + 15, fp32 dense (exact); stage 1 holds its own copy of the tied embedding."""
    prompts = ["The capital of France is", "def fibonacci(n):"]
    expected = _tokens(LLM(None, **BUILTIN), prompts)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert tally_main(["plan", "--model", str(resolve_model(None).path), "--weights", "dense", "--dtype", "fp32",
                           "--kv-cache-dtype", "fp32", "--max-model-len", "256", "--memory", "8GiB", "--bandwidth", "50GB/s",
                           "--flops", "100G", "-pp", "2", "--json"]) == 0
    plan = json.loads(buf.getvalue())
    with _parallel_llm(None, pipeline_parallel_size=2, **BUILTIN) as llm:
        assert _tokens(llm, prompts) == expected
        ledger = llm.engine.ledger
    for rank, planned in zip(ledger.ranks, plan["split"]["stage_weight_bytes"]):
        assert abs(rank["weight_bytes"] - planned) / planned < 0.01, (rank, planned)
        assert rank["kv_pool_bytes"] == ledger.kv_blocks * plan["kv"]["bytes_per_block_per_device"]  # 15 layers each
    assert [r["layers"] for r in ledger.ranks] == [[0, 15], [15, 30]]


def test_a_stage_that_dies_mid_generation_fails_the_engine_instead_of_hanging(tiny_llama):
    """Killed while steps run, so rank 0 is most likely inside a step (sending hidden states, waiting for logits)."""
    with _parallel_llm(str(tiny_llama), pipeline_parallel_size=2, max_model_len=256) as llm:
        failure: list[BaseException] = []

        def run() -> None:
            try:
                llm.generate(["The quick brown fox"] * 32, SamplingParams(max_tokens=240, ignore_eos=True),
                             use_tqdm=False)
            except BaseException as exc:  # noqa: BLE001 - the test reads it
                failure.append(exc)

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        deadline = time.monotonic() + 60
        # an int the generating thread writes (snapshot() would walk the KV pool while that thread changes it)
        while llm.engine.stats.num_steps < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        last_stage = llm.engine.parallel.followers[0]
        last_stage.kill()
        worker.join(120)
        assert not worker.is_alive(), "the engine hung on a dead stage"
        assert failure and isinstance(failure[0], EngineDeadError), failure
        last_stage.wait(30)
        with pytest.raises(EngineDeadError, match="parallel rank 1 exited"):
            llm.engine.check_health()
