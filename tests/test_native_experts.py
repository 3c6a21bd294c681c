"""A mixture of experts in one native call (tally/models/native_experts.py): a GGUF's experts served as their stored
blocks, a row's logits bitwise the same alone or in any batch, the one-call decode step through expert layers, and
the same greedy tokens as the PyTorch loop over the same layers and as the weights dequantized."""
from __future__ import annotations

from pathlib import Path

import pytest

from support.families import make_family_checkpoint, shared_family_checkpoint, shared_ggufs
from tally import LLM, SamplingParams
from tally.native import ops
from tally.quant.native_linear import NativeInt8Linear

pytestmark = pytest.mark.skipif(not ops.available(), reason="native kernels unavailable (see tally/native/library.py)")

# softmax over every expert, normalised top-k (Qwen3-MoE) or not (Mixtral); OLMoE: q/k norms over the whole
# projection; GPT-OSS: softmax over the top k logits, biases, clamped SwiGLU
FAMILIES = ("qwen3_moe", "mixtral", "olmoe", "gpt_oss")
PROMPTS = [{"prompt_token_ids": [5 + 3 * i + r for i in range(6 + 5 * r)]} for r in range(4)]
LOGPROBS = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=3)
ENGINE = dict(dtype="float32", max_model_len=64, kv_cache_memory=4_000_000, enable_prefix_caching=False)


@pytest.fixture(scope="module")
def files(run_shared_dir) -> dict[str, Path]:
    """Built once in the run for every test file that reads the same (tests/support/run_shared.py)."""
    # OLMoE's seed 0 gives a prompt a first-token near tie (logprobs 0.035 apart) that int8 activations swap
    dirs = {f: shared_family_checkpoint(run_shared_dir, f, **({"seed": 1} if f == "olmoe" else {})) for f in FAMILIES}
    ggufs = shared_ggufs(run_shared_dir, [(dirs[f], "q8_0") for f in FAMILIES])
    return dirs | {f"{f}-q8_0": path for f, path in zip(FAMILIES, ggufs)}


def _outputs(llm: LLM, prompts: list[dict]) -> list[tuple[list[int], list[dict[int, float]]]]:
    outs = llm.generate(prompts, LOGPROBS, use_tqdm=False)
    return [(list(o.outputs[0].token_ids), [{t: lp.logprob for t, lp in d.items()} for d in o.outputs[0].logprobs])
            for o in outs]


def _python_loop(llm: LLM) -> None:
    model = llm.engine.model
    for layer in model.layers:
        layer.experts.use_native = False
    model.native_step = None


def _close(a: list, b: list, tol: float) -> bool:
    """Same tokens; each step's chosen token's logprob within tol."""
    return all(ta == tb and all(abs(da[t] - db[t]) < tol for da, db, t in zip(la, lb, ta))
               for (ta, la), (tb, lb) in zip(a, b))


@pytest.mark.parametrize("family", FAMILIES)
def test_gguf_experts_run_their_blocks_natively_and_rows_do_not_depend_on_their_batch(files, family):
    llm = LLM(str(files[f"{family}-q8_0"]), **ENGINE)
    model = llm.engine.model
    moe = model.layers[0].experts
    assert all(isinstance(p, NativeInt8Linear) and p.group_size == 32 for p in [*moe.gate_up, *moe.down])  # Q8_0
    assert all(layer.experts.native() is not None for layer in model.layers)
    assert model.native_step is not None
    together = _outputs(llm, PROMPTS)
    # bitwise: prefill rows grouped by expert with other prompts' rows, decode rows with other requests'
    assert [_outputs(llm, [p])[0] for p in PROMPTS] == together

    _python_loop(llm)  # the same stored blocks through the per-expert PyTorch loop
    assert _close(_outputs(llm, PROMPTS), together, 1e-3)
    # the blocks dequantized, fp32 activations: near ties may part later (tests/test_family_gguf.py), the first may not
    dequantized = LLM(str(files[f"{family}-q8_0"]), quantization="none", **ENGINE)
    assert [t[0][0] for t in _outputs(dequantized, PROMPTS)] == [t[0][0] for t in together]


def test_one_call_step_through_expert_layers_equals_the_layer_by_layer_path(tmp_path):
    """int8 experts quantized at load, and a dense layer among the expert layers (Qwen3-MoE's mlp_only_layers)."""
    model_dir = make_family_checkpoint(tmp_path / "dense-layer", "qwen3_moe", num_hidden_layers=3, mlp_only_layers=[1])
    llm = LLM(str(model_dir), quantization="int8", **ENGINE)
    model = llm.engine.model
    assert model.layers[1].experts is None and model.native_step is not None
    step = _outputs(llm, PROMPTS)
    model.native_step, saved = None, model.native_step
    assert _close(_outputs(llm, PROMPTS), step, 1e-5)
    model.native_step = saved
    greedy = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)  # bursts of steps in one call
    assert [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, greedy, use_tqdm=False)] == [
        s[0] for s in step]
