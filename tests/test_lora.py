"""LoRA adapters offline: each adapter's greedy tokens are those of PEFT's merged model in fp32, a batch mixing three
adapters and the base (preempted under a small KV pool, over more adapters than --max-cpu-loras holds) gives each
request its own model's tokens, the prefix cache never hands one model's KV to another, and what is not implemented
is refused by name."""
from __future__ import annotations

import shutil

import pytest
import torch

from support.lora_adapters import ALL_TARGETS, edit_config, make_adapter, merged_greedy
from support.tiny_models import make_checkpoint
from tally import LLM, LoRARequest, SamplingParams
from tally.core.kv_manager import KVCacheManager
from tally.core.request import Request, RequestStatus
from tally.core.scheduler import Scheduler, SchedulerConfig
from tally.engine.config import EngineConfig
from tally.errors import ConfigError, InvalidRequestError
from tally.layers.lora import LoRASlots
from tally.models.lora_adapter import adapter_bytes_at_rank

MAX_TOKENS = 16
PROMPTS = [[40 + i, 41 + 2 * i, 100 + i, 7, 250 - i, 33, 90 + 3 * i, 12, 19 + i, 300, 5 + i, 61, 88, 120 + i, 14,
            200 + i, 3, 77 + i, 150, 9] for i in range(2)]
LORAS = {"qv": 1, "all": 2, "mlp": 3}


@pytest.fixture(scope="module")
def adapters(tiny_llama, tmp_path_factory):
    d = tmp_path_factory.mktemp("lora")
    return {
        "qv": make_adapter(tiny_llama, d / "qv", 1, ["q_proj", "v_proj"]),  # PEFT's default targets for Llama
        "all": make_adapter(tiny_llama, d / "all", 2, ALL_TARGETS, r=4, use_rslora=True),
        # parts of the fused gate_up, and one layer of two
        "mlp": make_adapter(tiny_llama, d / "mlp", 3, ["o_proj", "up_proj", "down_proj"], r=16, lora_alpha=8,
                            layers_to_transform=[1]),
    }


@pytest.fixture(scope="module")
def oracle(tiny_llama, adapters):
    refs = {name: merged_greedy(tiny_llama, path, PROMPTS, MAX_TOKENS) for name, path in adapters.items()}
    refs[None] = merged_greedy(tiny_llama, None, PROMPTS, MAX_TOKENS)
    return refs


@pytest.fixture(scope="module")
def llm(tiny_llama):
    # 2 adapters a step and in memory, 10 blocks of 16 tokens: a mix of three adapters waits, swaps adapters out
    # of memory and back, and is preempted
    return LLM(str(tiny_llama), dtype="float32", enable_lora=True, max_loras=2, max_cpu_loras=2,
               max_lora_rank=16, num_gpu_blocks_override=10, block_size=16, max_model_len=64)


def lora(adapters, name: str | None) -> LoRARequest | None:
    return None if name is None else LoRARequest(name, LORAS[name], str(adapters[name]))


def greedy(llm, prompts, loras) -> list[list[int]]:
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True),
                        use_tqdm=False, lora_request=loras)
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.mark.parametrize("name", ["qv", "all", "mlp"])
def test_each_adapter_matches_peft_merged_model_greedy(llm, adapters, oracle, name):
    assert greedy(llm, PROMPTS, lora(adapters, name)) == oracle[name]
    assert oracle[name] != oracle[None]  # the adapter changes the model


def test_a_batch_mixing_three_adapters_and_the_base_gives_each_its_own_models_tokens(llm, adapters, oracle):
    names = [None, "qv", "all", "mlp"] * 2
    prompts = [PROMPTS[i // 4] for i in range(len(names))]
    preempted = llm.engine.scheduler.num_preemptions
    got = greedy(llm, prompts, [lora(adapters, n) for n in names])
    assert got == [oracle[n][i // 4] for i, n in enumerate(names)]
    assert llm.engine.scheduler.num_preemptions > preempted  # and the preempted kept their adapters


def test_the_prefix_cache_keys_on_the_adapter(llm, adapters):
    prompt = [list(range(60, 100))]  # two full blocks
    params = SamplingParams(temperature=0, max_tokens=4)

    def cached(name):
        return llm.generate(prompt, params, use_tqdm=False, lora_request=lora(adapters, name))[0].num_cached_tokens
    assert cached(None) == 0
    assert cached("qv") == 0  # the base's blocks of the same tokens hold the base's KV
    assert cached("qv") == 32
    assert cached("all") == 0


def adapter_cases():
    def rank_too_large(base, d):
        return make_adapter(base, d, 5, ["q_proj"], r=32)

    def dora(base, d):
        return edit_config(make_adapter(base, d, 5, ["q_proj"]), use_dora=True)

    def modules_to_save(base, d):
        return edit_config(make_adapter(base, d, 5, ["q_proj"]), modules_to_save=["lm_head"])

    def lm_head_target(base, d):
        return edit_config(make_adapter(base, d, 5, ["q_proj"]), target_modules=["q_proj", "lm_head"])

    def other_model(base, d):
        return make_adapter(make_checkpoint(d / "small", "llama", hidden_size=32), d / "a", 5, ["q_proj"])

    def missing(base, d):
        return d / "nothing-here"

    def pickled_only(base, d):
        a = make_adapter(base, d, 5, ["q_proj"])
        (a / "adapter_model.safetensors").rename(a / "adapter_model.bin")
        return a

    return [(rank_too_large, "rank 32 but --max-lora-rank is 16; start the server with --max-lora-rank ≥ 32"),
            (dora, "uses DoRA"), (modules_to_save, "modules_to_save"), (lm_head_target, "lm_head"),
            (other_model, "trained on another model"), (missing, "has no adapter_config.json"),
            (pickled_only, "adapter_model.bin is not read")]


@pytest.mark.parametrize("make, says", adapter_cases(), ids=lambda c: getattr(c, "__name__", ""))
def test_a_bad_adapter_is_refused_by_name_and_the_engine_carries_on(llm, tiny_llama, adapters, oracle, tmp_path,
                                                                     make, says):
    bad = LoRARequest("bad", 9, str(make(tiny_llama, tmp_path)))
    with pytest.raises(InvalidRequestError, match=says.replace("(", r"\(")):
        greedy(llm, PROMPTS[:1], bad)
    assert greedy(llm, PROMPTS[:1], lora(adapters, "qv")) == oracle["qv"][:1]
    shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.mark.parametrize("kwargs, says", [
    (dict(lora_modules=["a=/x"]), "needs enable_lora"),
    (dict(enable_lora=True, lora_modules=["no-path"]), "is not name=path"),
    (dict(enable_lora=True, lora_modules=['{"name": "a"}']), "is not JSON with \"name\" and \"path\""),
    (dict(enable_lora=True, lora_modules=["a=/x", "a=/y"]), "names 'a' twice"),
    (dict(enable_lora=True, max_loras=4, max_cpu_loras=2), "max_cpu_loras \\(2\\) must be ≥ max_loras \\(4\\)"),
    (dict(enable_lora=True, speculative_config={"method": "ngram", "num_speculative_tokens": 2}),
     "speculative decoding does not run with LoRA"),
])
def test_lora_settings_are_checked_at_start(kwargs, says):
    with pytest.raises(ConfigError, match=says):
        EngineConfig(**kwargs)


def test_an_adapter_without_enable_lora_is_refused(tiny_llama, adapters):
    base_only = LLM(str(tiny_llama), dtype="float32", num_gpu_blocks_override=8, max_model_len=64)
    with pytest.raises(InvalidRequestError, match="--enable-lora"):
        greedy(base_only, PROMPTS[:1], lora(adapters, "qv"))


def test_each_row_gets_exactly_its_own_adapters_delta_whatever_the_layout():
    """Decode rows through the mask, prompt runs on their own slice, base rows untouched: each row's delta is its
    adapter's alone (tally/layers/lora.py)."""
    g = torch.Generator().manual_seed(0)
    ranks = [4, 8, 2]  # slot 2 has no weights for this site
    adapters = [{(0, "qkv"): (torch.randn(r, 16, generator=g), torch.randn(24, r, generator=g))} for r in ranks[:2]]
    adapters.append({(0, "o"): (torch.randn(2, 16, generator=g), torch.randn(16, 2, generator=g))})
    slots = [1, -1, 0, 2, 1] + [0] * 9 + [-1] * 10 + [1] * 8 + [2] * 8 + [1] * 3
    x, y = torch.randn(len(slots), 16, generator=g), torch.randn(len(slots), 24, generator=g)
    lora_slots = LoRASlots()
    lora_slots.begin(["a", "b", "c"], adapters, torch.tensor(slots))
    got = lora_slots.add_delta(0, "qkv", x, y.clone())
    for row, slot in enumerate(slots):
        want = y[row] if slot in (-1, 2) else y[row] + (x[row] @ adapters[slot][(0, "qkv")][0].T) \
            @ adapters[slot][(0, "qkv")][1].T
        torch.testing.assert_close(got[row], want, msg=f"row {row} (slot {slot})")
        if slot in (-1, 2):
            assert torch.equal(got[row], y[row])  # exactly: a base row's output is the base's
    lora_slots.end()


def test_the_ledger_counts_adapter_memory(llm):
    lora = llm.engine.ledger.lora
    assert lora["capacity_bytes"] == 2 * adapter_bytes_at_rank(llm.engine.model.cfg, 16, torch.float32) > 0
    assert "LoRA adapters up to" in llm.engine.ledger.format()


def test_a_step_holds_at_most_max_loras_adapters_and_the_others_keep_their_place():
    s = Scheduler(SchedulerConfig(max_loras=2), KVCacheManager(64, 4, enable_prefix_caching=False))
    reqs = [Request(f"r{i}", [1, 2, 3], 4, 0.0, lora_key=key) for i, key in enumerate(["a", "b", None, "c", "a"])]
    for r in reqs:
        s.add(r)
    out = s.schedule()
    assert [x.request.request_id for x in out.scheduled] == ["r0", "r1", "r2", "r4"]  # c waits: a and b run
    assert [r.request_id for r in s.waiting] == ["r3"]
    s.finish(reqs[0], RequestStatus.FINISHED_STOPPED)
    s.finish(reqs[4], RequestStatus.FINISHED_STOPPED)  # a has left: c takes its place
    assert [x.request.request_id for x in s.schedule().scheduled][-1] == "r3"
