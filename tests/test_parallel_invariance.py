"""Tensor and pipeline parallel give one process's answer bitwise: two TP ranks and two PP stages, each in real
processes, against one process on the same batch, comparing every prompt and sampled logprob exactly, on the
built-in GGUF, a dense bf16 checkpoint, a mixture of experts' GGUF (its experts in their native call) and OLMo 2 (q/k
norms over the whole projection, gathered across ranks: on the native fp32 layer with its one KV head replicated on
both ranks, and on the PyTorch layer in bf16 compute)."""
from __future__ import annotations


import pytest
from support.families import make_family_checkpoint, to_gguf
from support.tiny_models import make_checkpoint
from test_batch_invariance import _as_bf16

from tally import LLM, SamplingParams
from tally.native import ops

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=0, prompt_logprobs=0)
PROMPTS = [{"prompt_token_ids": [7 + (5 * i + 3 * r) % 90 for i in range(3 + 9 * r)]} for r in range(4)]
SPLITS = {"one process": {}, "TP=2": dict(tensor_parallel_size=2), "PP=2": dict(pipeline_parallel_size=2)}
# a 16-token step budget splits the longer prompts across steps, beside the others' decodes
ENGINE = dict(max_model_len=128, kv_cache_memory=16 * 2**20, max_num_batched_tokens=16)
Logprobs = list[tuple[list[int], list[float], list[float]]]


def _logprobs(model: tuple[str | None, dict], split: dict) -> tuple[Logprobs, bool]:
    """Each prompt's greedy tokens, its prompt logprobs and its tokens' logprobs; whether the experts (if any) ran
    their native call on rank 0."""
    path, options = model
    llm = LLM(path, **ENGINE, **options, **split)
    try:
        outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        layers = llm.engine.model.layers
        native = all(layer.experts.native() is not None for layer in layers if layer.experts is not None)
    finally:
        llm.engine.shutdown()
    return [(list(o.outputs[0].token_ids), [next(iter(p.values())).logprob for p in o.prompt_logprobs[1:]],
             [lp[t].logprob for lp, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)]) for o in outs], native


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, tuple[str | None, dict]]:
    root = tmp_path_factory.mktemp("parallel-invariance")
    bf16 = _as_bf16(make_checkpoint(root / "bf16", "llama", hidden_size=128, intermediate_size=256,
                                    num_attention_heads=8, num_key_value_heads=4))
    moe = to_gguf(make_family_checkpoint(root / "moe", "qwen3_moe", moe_intermediate_size=64), root / "moe.gguf",
                  "q8_0")
    olmo = make_family_checkpoint(root / "olmo2", "olmo2", num_key_value_heads=1)
    olmo_bf16 = make_family_checkpoint(root / "olmo2-bf16", "olmo2")
    return {"built-in GGUF": (None, {}), "dense bf16": (str(bf16), {}), "experts GGUF q8_0": (str(moe), {}),
            "olmo2 one KV head": (str(olmo), {}), "olmo2 bf16 compute": (str(olmo_bf16), {"dtype": "bfloat16"})}


@pytest.mark.skipif(not ops.available(), reason="the GGUF blocks and fp16 panels run on the native kernels")
@pytest.mark.parametrize("model", ["built-in GGUF", "dense bf16", "experts GGUF q8_0", "olmo2 one KV head",
                                   "olmo2 bf16 compute"])
def test_two_ranks_and_two_stages_give_one_process_logprobs_bitwise(models: dict[str, tuple[str | None, dict]],
                                                                      model: str) -> None:
    """TP's o_proj and down_proj split by their outputs (no partial sums added), experts whole on each rank; PP's
    stages run the very layers one process runs."""
    (one, _), *rest = [_logprobs(models[model], split) for split in SPLITS.values()]
    for name, (got, native) in zip(list(SPLITS)[1:], rest):
        assert got == one, name
        assert native, name
