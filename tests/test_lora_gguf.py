"""GGUF LoRA adapters, made by llama.cpp's own convert_lora_to_gguf.py from a PEFT adapter: served from --lora-modules
and LoRARequest with the greedy tokens of PEFT's merged model in fp32, read as the PEFT folder's weights whatever
--outtype wrote them as (q/k rows put back in order), and a GGUF that is not a LoRA adapter refused by name."""
from __future__ import annotations

import pytest
import torch

from support.families import LORA_CONVERTER, run_converters
from support.lora_adapters import ALL_TARGETS, make_adapter, merged_greedy
from tally import LLM, LoRARequest, SamplingParams
from tally.errors import InvalidRequestError
from tally.models.gguf_header import read_header
from tally.models.lora_adapter import load_adapter
from tally.models.lora_gguf import load_gguf_adapter
from tally.models.registry import resolve_model

MAX_TOKENS = 16
PROMPTS = [[40 + i, 41 + 2 * i, 100 + i, 7, 250 - i, 33, 90 + 3 * i, 12, 19 + i, 300, 5 + i, 61] for i in range(2)]
OUTTYPES = ("f32", "f16", "bf16", "q8_0")


@pytest.fixture(scope="module")
def files(tiny_llama, tmp_path_factory):
    """The PEFT adapter and its GGUF at each outtype, from one converter process."""
    d = tmp_path_factory.mktemp("lora-gguf")
    # every projection, so that q and k's lora_b rows (interleaved by the converter) count; rank 16 keeps
    # q8_0 on lora_a (rows of 64) while its lora_b (rows of 16) stays float
    adapter = make_adapter(tiny_llama, d / "peft", 4, ALL_TARGETS, r=16, lora_alpha=8)
    ggufs = {t: d / f"adapter-{t}.gguf" for t in OUTTYPES}
    run_converters([[LORA_CONVERTER, adapter, "--base", tiny_llama, "--outfile", out, "--outtype", t]
                    for t, out in ggufs.items()])
    return adapter, ggufs


@pytest.fixture(scope="module")
def llm(tiny_llama, files):
    return LLM(str(tiny_llama), dtype="float32", enable_lora=True, max_lora_rank=16, max_model_len=64,
               num_gpu_blocks_override=8, lora_modules=[f"g={files[1]['f32']}"])


def greedy(llm, lora: LoRARequest | None) -> list[list[int]]:
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True),
                        use_tqdm=False, lora_request=lora)
    return [list(o.outputs[0].token_ids) for o in outs]


def test_a_gguf_adapter_gives_peft_merged_models_greedy_tokens(llm, tiny_llama, files):
    adapter, ggufs = files
    want = merged_greedy(tiny_llama, adapter, PROMPTS, MAX_TOKENS)
    assert want != merged_greedy(tiny_llama, None, PROMPTS, MAX_TOKENS)  # the adapter changes the model
    assert greedy(llm, LoRARequest("g", 1, str(ggufs["f32"]))) == want


def test_each_outtype_reads_as_the_peft_folders_weights(llm, files):
    adapter, ggufs = files
    cfg = llm.engine.model.cfg
    peft = load_adapter("p", str(adapter), cfg, 16, torch.float32)
    tolerance = {"f32": 0.0, "f16": 1e-3, "bf16": 1e-2, "q8_0": 1e-2}  # relative, of each outtype's rounding
    assert "Q8_0" in {info.ggml_type.name for info in read_header(ggufs["q8_0"]).tensors}  # blocks, not floats
    for outtype, path in ggufs.items():
        got = load_gguf_adapter("g", str(path), cfg, 16, torch.float32)
        assert got.rank == peft.rank and got.weights.keys() == peft.weights.keys()
        for site, (a, b) in peft.weights.items():
            for mine, theirs in zip(got.weights[site], (a, b)):
                torch.testing.assert_close(mine, theirs, rtol=tolerance[outtype], atol=tolerance[outtype] * 0.5,
                                           msg=lambda m, t=outtype, s=site: f"{t} {s}: {m}")


def test_a_gguf_that_is_not_a_lora_adapter_is_refused_by_name_and_the_engine_carries_on(llm, files):
    _, ggufs = files
    base = resolve_model(None).path  # the built-in model: a GGUF llama.cpp made, of a model
    with pytest.raises(InvalidRequestError, match="is a GGUF model, not an adapter"):
        greedy(llm, LoRARequest("base", 2, str(base)))
    with pytest.raises(InvalidRequestError, match="there is no file"):
        greedy(llm, LoRARequest("none", 3, str(ggufs["f32"].with_name("missing.gguf"))))
    assert greedy(llm, LoRARequest("g", 1, str(ggufs["f32"]))) == greedy(llm, LoRARequest("g", 1, str(ggufs["f32"])))
