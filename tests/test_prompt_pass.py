"""A prompt that joins decoding streams under --max-itl runs as a pass of its own, a slice of layers after each decode
step (tally/engine/prompt_pass.py): its outputs, prompt logprobs and LoRA rows keep their bits; a held request that
is aborted or preempted mid-pass drops the pass, leaks no block, and the others carry on with their own tokens."""
from __future__ import annotations

import json

import pytest
from support.engine_checks import assert_no_block_leak, bytes_for_blocks
from support.lora_adapters import make_adapter, merged_greedy
from support.tiny_models import make_checkpoint

from tally import LLM, LoRARequest, SamplingParams
from tally.core.request import RequestStatus

STREAM = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
LONG = [11 + (7 * i) % 300 for i in range(45)]
SHORT = [5, 77, 130, 9, 41, 250]
EVERY_STEP = 1e-9  # a target no step meets: each slice is one layer


def alone(model_dir, prompt: list[int], params: SamplingParams, **kw) -> list[int]:
    llm = LLM(str(model_dir), dtype="float32", kv_cache_memory=4_000_000, **kw)
    return list(llm.generate({"prompt_token_ids": prompt}, params)[0].outputs[0].token_ids)


def start_stream(llm: LLM) -> None:
    llm.engine.add_request("stream", {"prompt_token_ids": SHORT}, STREAM)
    for _ in range(3):
        llm.engine.step()


def step_until_held(llm: LLM) -> None:
    for _ in range(5):
        if llm.engine._pass is not None:
            return
        llm.engine.step()
    raise AssertionError("the prompt beside the stream was never held as a pass")


def test_a_prompt_beside_decodes_runs_a_layer_a_step_with_its_bits(tiny_llama, tmp_path):
    log = tmp_path / "steps.jsonl"
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory=4_000_000, max_itl_s=EVERY_STEP,
              step_log=str(log))
    start_stream(llm)
    llm.engine.add_request("long", {"prompt_token_ids": LONG}, STREAM)
    final = llm.engine.run_until_done()
    llm.engine.shutdown()
    assert list(final["long"].outputs[0].token_ids) == alone(tiny_llama, LONG, STREAM)
    assert list(final["stream"].outputs[0].token_ids) == alone(tiny_llama, SHORT, STREAM)
    slices = [s["slice"] for s in map(json.loads, log.read_text().splitlines()) if s["slice"]]
    layers = len(llm.engine.model.layers)
    passes = len(slices) // layers  # the prompt in one pass or several (chunks), each a layer a step, in order
    assert [s["layers"] for s in slices] == [[i, i + 1] for i in range(layers)] * passes
    assert sum(s["tokens"] for s in slices if s["layers"][1] == layers) == len(LONG)
    assert llm.engine.scheduler.held == set()
    assert_no_block_leak(llm)


def test_prompt_logprobs_and_a_lora_adapter_in_a_pass_keep_their_bits(tiny_llama, tmp_path):
    adapter = make_adapter(tiny_llama, tmp_path / "qv", 1, ["q_proj", "v_proj"])
    lora = LoRARequest("qv", 1, str(adapter))
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, prompt_logprobs=2)
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory=4_000_000, max_itl_s=EVERY_STEP, enable_lora=True)
    start_stream(llm)
    llm.engine.add_request("long", {"prompt_token_ids": LONG}, params, lora_request=lora)
    step_until_held(llm)
    final = llm.engine.run_until_done()
    plain = LLM(str(tiny_llama), dtype="float32", kv_cache_memory=4_000_000, enable_lora=True)
    reference = plain.generate({"prompt_token_ids": LONG}, params, lora_request=lora)[0]
    assert final["long"].outputs[0].token_ids == reference.outputs[0].token_ids
    assert final["long"].outputs[0].token_ids == merged_greedy(tiny_llama, adapter, [LONG], 8)[0]
    assert final["long"].prompt_logprobs == reference.prompt_logprobs
    assert_no_block_leak(llm)


def test_a_request_aborted_mid_pass_drops_it_and_the_stream_carries_on(tiny_llama):
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory=4_000_000, max_itl_s=EVERY_STEP)
    start_stream(llm)
    llm.engine.add_request("long", {"prompt_token_ids": LONG}, STREAM)
    step_until_held(llm)
    llm.engine.step()  # a slice in: some layers of the pass have written their KV
    llm.engine.abort_request("long")
    final = llm.engine.run_until_done()
    assert final["long"].outputs[0].finish_reason == "abort"
    assert list(final["stream"].outputs[0].token_ids) == alone(tiny_llama, SHORT, STREAM)
    assert llm.engine._pass is None and llm.engine.scheduler.held == set()
    assert_no_block_leak(llm)


@pytest.fixture(scope="module")
def deep_llama(tmp_path_factory):
    """12 layers: a pass a layer a step outlasts the stream's next few blocks."""
    return make_checkpoint(tmp_path_factory.mktemp("deep-llama"), "llama", num_hidden_layers=12)


def test_a_held_request_preempted_mid_pass_recomputes_with_its_bits(deep_llama):
    # 8 blocks of 4 tokens: the stream's next block finds the pool full while the pass holds its prompt's blocks,
    # and the newest running request, the held one, is preempted; it is computed again once there is room
    short_long, params = LONG[:20], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    llm = LLM(str(deep_llama), dtype="float32", block_size=4, max_model_len=32, enable_prefix_caching=False,
              kv_cache_memory=bytes_for_blocks(deep_llama, 8, block_size=4), max_itl_s=EVERY_STEP,
              preemption_mode="recompute")
    start_stream(llm)
    llm.engine.add_request("long", {"prompt_token_ids": short_long}, params)
    step_until_held(llm)
    held = llm.engine._pass.requests[0]
    outputs = {}
    while llm.engine._pass is not None:
        outputs.update({o.request_id: o for o in llm.engine.step() if o.finished})
    assert held.num_preemptions > 0 and held.status is not RequestStatus.RUNNING  # dropped, not finished
    outputs.update(llm.engine.run_until_done())
    assert list(outputs["long"].outputs[0].token_ids) == alone(deep_llama, short_long, params)
    assert list(outputs["stream"].outputs[0].token_ids) == alone(deep_llama, SHORT, STREAM)
    assert llm.engine.scheduler.held == set()
    assert_no_block_leak(llm)
