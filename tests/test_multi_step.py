"""Multi-step decode (tally/engine/multi_step.py): several greedy decode steps in one native call change no output."""
from __future__ import annotations

import openai
import pytest
import torch

from tally import LLM, SamplingParams
from tally.engine.config import EngineConfig
from tally.engine.inputs import build_span_inputs
from tally.errors import ConfigError
from tally.native import ops
from tally.server.cli import parse_args
from tally.server.process import ServerProcess

pytestmark = pytest.mark.skipif(not ops.available(), reason="native kernels unavailable (see tally/native/library.py)")

PROMPTS = ["hello world", "the quick brown fox jumps", "a", "one two three four five six seven"]


@pytest.fixture(scope="module")
def tiny_qwen2(tiny_model_factory):
    return str(tiny_model_factory("qwen2"))  # int4 layers and a tied int8 head: the call goes from ids to logits


def test_a_burst_equals_its_steps_one_call_at_a_time(tiny_qwen2):
    """greedy_steps(steps=5) gives the tokens of five one-step calls, each fed the argmax of the last: rows starting
    at different positions, one crossing into its next block mid-burst."""
    llm = LLM(tiny_qwen2, dtype="float32", quantization="int4", kv_cache_memory=2_000_000)
    model, caches, bs = llm.engine.model, llm.engine.kv_caches, llm.engine.kv.block_size
    assert model.runs_greedy_steps(caches)
    tables, starts, steps = [[1, 4], [2], [3, 5]], [0, 3, bs - 2], 5
    ids = torch.tensor([5, 9, 17])
    _, positions, meta, _ = build_span_inputs([(t, s, [i]) for t, s, i in zip(tables, starts, ids.tolist())], bs,
                                              starts)
    burst = model.greedy_steps(ids, positions, caches, meta, steps, [(), (), ()])
    stepped, current = [], ids
    for s in range(steps):
        spans = [(t, p + s, [i]) for t, p, i in zip(tables, starts, current.tolist())]
        step_ids, step_positions, step_meta, _ = build_span_inputs(spans, bs, [p for _, p, _ in spans])
        logits = model.forward_logits(step_ids, step_positions, caches, step_meta, torch.arange(3))
        current = logits.argmax(dim=-1)
        stepped.append(current)
    assert torch.equal(burst, torch.stack(stepped, dim=1))
    # the call ends after the step where every row has made one of its stop ids; one row without any runs them all
    stops = [(int(burst[0, 1]),), (int(burst[1, 2]), 10_000), (int(burst[2, 0]),)]
    ran = max(burst[r].tolist().index(stop[0]) for r, stop in enumerate(stops)) + 1
    assert torch.equal(model.greedy_steps(ids, positions, caches, meta, steps, stops), burst[:, :ran])
    assert torch.equal(model.greedy_steps(ids, positions, caches, meta, steps, [*stops[:2], ()]), burst)


def _outputs(llm: LLM, steps: int, params: list[SamplingParams]) -> tuple[list, int]:
    """Each request's tokens, text and finish reason with bursts of `steps`, and the engine steps it took."""
    engine = llm.engine
    engine._burst_limit, before = steps, engine.stats.num_steps
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    assert engine.kv.num_used_blocks() == 0  # every block back in the pool, those the bursts took included
    return [(o.outputs[0].token_ids, o.outputs[0].text, o.outputs[0].finish_reason) for o in outs], \
        engine.stats.num_steps - before


def test_bursts_change_no_greedy_output_and_end_where_requests_stop(tiny_qwen2):
    """Batched greedy requests of different lengths, one stopped by a token id mid-burst, one by a stop string:
    the same tokens, text and finish reasons with bursts of 8 and 3 as one step at a time, in fewer steps."""
    llm = LLM(tiny_qwen2, dtype="float32", quantization="int4", kv_cache_memory=2_000_000)
    assert llm.engine.config.num_scheduler_steps == 8 and llm.engine._burst_limit == 8  # LLM()'s default
    plain = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (30, 21, 9, 2)]
    reference, one_step_count = _outputs(llm, 1, plain)
    first = reference[0][0]
    stop_id = first[11]  # a token the first request makes: it finishes there, inside a burst
    stopping = [SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop_token_ids=[stop_id]),
                SamplingParams(temperature=0, max_tokens=21, ignore_eos=True, stop=[reference[1][1][5:9]]),
                *plain[2:]]
    stop_reference, _ = _outputs(llm, 1, stopping)
    assert stop_reference[0][2] == "stop" and stop_reference[1][2] == "stop"
    for steps in (8, 3):
        outputs, count = _outputs(llm, steps, plain)
        assert outputs == reference and count < one_step_count
        assert _outputs(llm, steps, stopping)[0] == stop_reference
    alone = llm.generate(PROMPTS[0], stopping[0], use_tqdm=False)[0].outputs[0]  # the call itself ends at the stop
    assert (alone.token_ids, alone.finish_reason) == (stop_reference[0][0], "stop")


def test_a_batch_with_a_request_the_sampler_must_see_runs_one_step_at_a_time(tiny_qwen2):
    """A sampled request, one asking for logprobs, one with a repetition penalty: while any runs, no bursts, and every
    output is what one step at a time gives."""
    llm = LLM(tiny_qwen2, dtype="float32", quantization="int4", kv_cache_memory=2_000_000)
    mixed = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
             SamplingParams(temperature=0.8, seed=3, max_tokens=12, ignore_eos=True),
             SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=1),
             SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, repetition_penalty=1.3)]
    reference, count = _outputs(llm, 1, mixed)
    assert _outputs(llm, 8, mixed) == (reference, count)


def test_without_room_in_the_pool_a_burst_falls_back_to_one_step(tiny_qwen2):
    """Two 8-token prompts in 7 blocks of 4: a burst of 7 would need 4 blocks each, so the first decodes fall back
    to one step at a time, then one request is preempted, and the other's tail runs as a burst. The tokens are
    those of one step at a time in a big pool, and every block comes back."""
    prompts = [{"prompt_token_ids": [5 + i, 9, 17, 30, 41, 3, 8, 60 + i]} for i in range(2)]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    common = {"dtype": "float32", "quantization": "int4", "enable_prefix_caching": False}
    big = LLM(tiny_qwen2, kv_cache_memory=4_000_000, num_scheduler_steps=1, **common)
    small = LLM(tiny_qwen2, block_size=4, num_gpu_blocks_override=7, max_model_len=28, **common)
    tokens = [[o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)] for llm in (big, small)]
    assert tokens[0] == tokens[1]
    assert small.engine.scheduler.num_preemptions > 0 and small.engine.kv.num_used_blocks() == 0


def test_the_server_keeps_one_step_a_burst_and_bad_values_are_refused():
    """tally serve's clients stream: one decode step a step unless asked; LLM() takes 8 (above)."""
    assert parse_args([]).num_scheduler_steps == 1
    assert parse_args(["--num-scheduler-steps", "4"]).num_scheduler_steps == 4
    with pytest.raises(ConfigError, match="num_scheduler_steps must be ≥ 1"):
        EngineConfig(num_scheduler_steps=0)


def test_a_server_asked_for_bursts_streams_the_text_of_one_step_at_a_time(tiny_qwen2):
    """tally serve --num-scheduler-steps 8: streamed chunks of several tokens add up to the one-step text, and a
    stop string that lands inside a burst ends the stream where it ends the offline output."""
    llm = LLM(tiny_qwen2, dtype="float32", quantization="int4", max_model_len=256, num_scheduler_steps=1)
    flags = ["--served-model-name", "tiny", "--dtype", "float32", "--quantization", "int4", "--max-model-len", "256",
             "--kv-cache-memory", "8MB", "--num-scheduler-steps", "8", "--log-level", "warning"]
    with ServerProcess([tiny_qwen2, *flags]) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)
        for prompt in PROMPTS[:2]:
            full = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=40), use_tqdm=False)[0].outputs[0]
            for stop in ([], [full.text[len(full.text) // 2:len(full.text) // 2 + 3]]):
                want = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=40, stop=stop),
                                    use_tqdm=False)[0].outputs[0]
                chunks = list(client.completions.create(model="tiny", prompt=prompt, stream=True, temperature=0,
                                                        max_tokens=40, stop=stop or None))
                text = "".join(c.choices[0].text for c in chunks)
                reason = next(c.choices[0].finish_reason for c in reversed(chunks) if c.choices[0].finish_reason)
                assert (text, reason) == (want.text, want.finish_reason)
                if not stop:  # 40 tokens came in bursts: far fewer chunks than tokens
                    assert len(chunks) <= 40 // 4
