"""Pooling requests in the engine: embeddings match transformers' final hidden states pooled the same way (LAST,
MEAN, CLS; fp32), whether the prompt runs alone, in chunks, from the prefix cache, or in the same steps as
generation requests, whose tokens do not change either; the checkpoint's sentence-transformers modules set the
defaults; LLM.embed / LLM.score / LLM.generate refuse the other task."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from support.engine_checks import assert_no_block_leak

from tally import LLM, SamplingParams
from tally.errors import ConfigError, InvalidRequestError
from tally.pooling_params import PoolingParams

SHORT = "Paris is the capital of France."
LONG = "The quick brown fox jumps over the lazy dog. " * 4  # 40 tokens: chunked under a budget of 16
ENGINE = dict(dtype="float32", kv_cache_memory=2_000_000)


def _reference(model_dir, ids: list[int], pooling: str, normalize: bool = True) -> torch.Tensor:
    import transformers

    hf = transformers.AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        h = hf(torch.tensor([ids])).last_hidden_state[0]
    v = {"LAST": h[-1], "MEAN": h.mean(0), "CLS": h[0]}[pooling]
    return F.normalize(v, dim=0) if normalize else v


def _embed(llm: LLM, prompts, **kw) -> list[torch.Tensor]:
    return [torch.tensor(o.outputs.embedding) for o in llm.embed(prompts, use_tqdm=False, **kw)]


@pytest.mark.parametrize("pooling", ["LAST", "MEAN", "CLS"])
def test_embeddings_match_transformers_pooled_alone_chunked_and_cached(tiny_model_factory, pooling):
    model_dir = tiny_model_factory("qwen3")
    llm = LLM(str(model_dir), runner="pooling", max_num_batched_tokens=16, pooler_config={"pooling_type": pooling},
              **ENGINE)
    tok = llm.get_tokenizer()
    first = _embed(llm, [SHORT, LONG])
    for prompt, got in zip([SHORT, LONG], first):
        assert (got - _reference(model_dir, tok.encode(prompt), pooling)).abs().max() < 1e-5
    again = llm.embed([LONG], use_tqdm=False)[0]  # LAST reuses the cached prefix; MEAN and CLS read it all again
    assert (again.num_cached_tokens > 0) == (pooling == "LAST")
    assert torch.allclose(torch.tensor(again.outputs.embedding), first[1], atol=1e-6)
    assert_no_block_leak(llm)


def test_embeddings_share_steps_with_generation_and_change_nothing(tiny_model_factory):
    model_dir = tiny_model_factory("llama")
    llm = LLM(str(model_dir), runner="pooling", max_num_batched_tokens=24, enable_prefix_caching=False,
              pooler_config={"pooling_type": "MEAN"}, **ENGINE)
    engine = llm.engine
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    alone = {}
    for rid, prompt, params in [("g", SHORT, greedy), ("e1", LONG, PoolingParams()), ("e2", SHORT, PoolingParams())]:
        engine.add_request(rid, prompt, params)
        alone.update(engine.run_until_done())
    for rid, prompt, params in [("g", SHORT, greedy), ("e1", LONG, PoolingParams()), ("e2", SHORT, PoolingParams())]:
        engine.add_request(rid, prompt, params)
    together, shared_steps = {}, 0
    while engine.has_unfinished_requests():
        together.update({o.request_id: o for o in engine.step() if o.finished})
        # both still running after a step: both were in it (each is scheduled every step it runs, budget allowing)
        shared_steps += len({r.pooling is None for r in engine.scheduler.running}) == 2
    assert shared_steps > 0
    assert together["g"].outputs[0].token_ids == alone["g"].outputs[0].token_ids
    for rid in ("e1", "e2"):
        assert torch.allclose(torch.tensor(together[rid].outputs.embedding),
                              torch.tensor(alone[rid].outputs.embedding), atol=1e-6)
    assert (torch.tensor(alone["e1"].outputs.embedding)
            - _reference(model_dir, llm.get_tokenizer().encode(LONG), "MEAN")).abs().max() < 1e-5
    assert_no_block_leak(llm)


def test_dimensions_and_normalize_per_request(tiny_model_factory):
    model_dir = tiny_model_factory("qwen3")
    llm = LLM(str(model_dir), runner="pooling", pooler_config='{"is_matryoshka": true}', **ENGINE)
    raw = _reference(model_dir, llm.get_tokenizer().encode(SHORT), "LAST", normalize=False)
    (short,) = _embed(llm, SHORT, pooling_params=PoolingParams(dimensions=16))
    assert torch.allclose(short, F.normalize(raw[:16], dim=0), atol=1e-5)  # truncate, then normalise
    (plain,) = _embed(llm, SHORT, pooling_params=PoolingParams(normalize=False))
    assert torch.allclose(plain, raw, atol=1e-4)
    with pytest.raises(InvalidRequestError, match="dimensions") as err:
        llm.embed(SHORT, PoolingParams(dimensions=65), use_tqdm=False)
    assert err.value.param == "dimensions"
    scores = llm.score(SHORT, [SHORT, LONG], use_tqdm=False)
    assert scores[0].outputs.score == pytest.approx(1.0, abs=1e-5) and scores[1].outputs.score < 0.999
    with pytest.raises(InvalidRequestError, match="--runner generate"):
        llm.generate(SHORT, use_tqdm=False)
    assert_no_block_leak(llm)


def test_sentence_transformers_modules_set_the_defaults(tiny_model_factory, tmp_path):
    st_dir = tmp_path / "st"
    shutil.copytree(tiny_model_factory("qwen3"), st_dir)
    (st_dir / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (st_dir / "1_Pooling").mkdir()
    (st_dir / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 64, "pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False}))
    llm = LLM(str(st_dir), **ENGINE)  # runner auto: a sentence-transformers folder is an embedding model
    assert llm.engine.supported_tasks == ("embed",)
    assert (llm.engine.pooler.pooling_type, llm.engine.pooler.normalize) == ("MEAN", False)
    (got,) = _embed(llm, LONG)
    assert (got - _reference(st_dir, llm.get_tokenizer().encode(LONG), "MEAN", normalize=False)).abs().max() < 1e-4
    with pytest.raises(InvalidRequestError, match="dimensions"):  # not Matryoshka-trained
        llm.embed(SHORT, PoolingParams(dimensions=8), use_tqdm=False)
    modules = json.loads((st_dir / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (st_dir / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ConfigError, match="Dense"):
        LLM(str(st_dir), **ENGINE)


def test_a_generative_model_refuses_embed_and_the_flags_must_agree(tiny_model_factory):
    llm = LLM(str(tiny_model_factory("llama")), **ENGINE)
    assert llm.engine.supported_tasks == ("generate",)
    with pytest.raises(InvalidRequestError, match="--runner pooling"):
        llm.embed(SHORT, use_tqdm=False)
    with pytest.raises(ConfigError, match="disagree"):
        LLM(str(tiny_model_factory("llama")), runner="generate", convert="embed", **ENGINE)
    with pytest.raises(ConfigError, match="pooling_type"):
        LLM(str(tiny_model_factory("llama")), pooler_config={"pooling_type": "MAX"}, **ENGINE)
