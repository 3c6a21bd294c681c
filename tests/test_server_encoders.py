"""Encoder models through a real `tally serve`: a BERT embedding model answers the official `openai` client's
embeddings.create with sentence-transformers' vectors, and scores by cosine; an XLM-R cross-encoder answers /v1/score
and the rerank routes with CrossEncoder.predict's scores; bad input gets a 400 naming the field, each server refuses
what its model does not do, and both carry on and report models, metrics and the ledger."""
from __future__ import annotations

import httpx
import numpy as np
import openai
import pytest
from support.encoders import make_bi_encoder, make_cross_encoder
from support.servers import started

from tally.server.process import ServerProcess

COMMON = ["--served-model-name", "tiny", "--log-level", "warning", "--max-num-seqs", "4"]
TEXTS = ["paris is the capital of france", "the quick brown fox jumps over the lazy dog", "a", "rome is in italy"]
QUERY = "what is the capital of france"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return (make_bi_encoder(tmp_path_factory.mktemp("embed"), "bert", "mean", True),
            make_cross_encoder(tmp_path_factory.mktemp("rerank"), "xlm-roberta"))


@pytest.fixture(scope="module")
def servers(models):
    with started(ServerProcess([str(models[0]), *COMMON]),
                 ServerProcess([str(models[1]), *COMMON, "--task", "score"])) as both:
        yield both


def _post(server: ServerProcess, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=120)


def test_openai_client_embeddings_match_sentence_transformers(servers, models):
    from sentence_transformers import SentenceTransformer

    want = SentenceTransformer(str(models[0]), device="cpu").encode(TEXTS)
    client = openai.OpenAI(base_url=servers[0].base_url, api_key="none", max_retries=0)
    got = client.embeddings.create(model="tiny", input=TEXTS)  # the client asks for base64 and decodes it
    assert np.abs(np.array([d.embedding for d in got.data]) - want).max() < 1e-5
    floats = client.embeddings.create(model="tiny", input=TEXTS[1], encoding_format="float")
    assert np.abs(np.array(floats.data[0].embedding) - want[1]).max() < 1e-5
    scored = _post(servers[0], "/v1/score", {"text_1": QUERY, "text_2": TEXTS}).json()
    query = SentenceTransformer(str(models[0]), device="cpu").encode([QUERY])[0]
    assert [d["score"] for d in scored["data"]] == pytest.approx(list(want @ query), abs=1e-5)


def test_cross_encoder_scores_and_reranks_as_crossencoder_predict(servers, models):
    from sentence_transformers import CrossEncoder

    want = CrossEncoder(str(models[1]), device="cpu").predict([(QUERY, t) for t in TEXTS])
    server = servers[1]
    scored = _post(server, "/v1/score", {"model": "tiny", "text_1": QUERY, "text_2": TEXTS}).json()
    assert [d["score"] for d in scored["data"]] == pytest.approx(list(want), abs=1e-5)
    order = list(np.argsort(-want))
    for path in ("/v1/rerank", "/v2/rerank"):
        ranked = _post(server, path, {"query": QUERY, "documents": TEXTS, "top_n": 3}).json()
        assert [r["index"] for r in ranked["results"]] == order[:3]
        assert ranked["results"][0]["relevance_score"] == pytest.approx(float(want[order[0]]), abs=1e-5)
        assert ranked["usage"]["prompt_tokens"] > 0


@pytest.mark.parametrize("which, path, body, param", [
    (0, "/v1/embeddings", {"input": ""}, "input"),
    (0, "/v1/embeddings", {"input": []}, "input"),
    (0, "/v1/embeddings", {"input": 7}, "input"),
    (0, "/v1/embeddings", {"input": [[1, 2, 99999]]}, "input"),
    (0, "/v1/embeddings", {"input": "dog " * 80}, "input"),  # longer than the 64 positions
    (0, "/v1/embeddings", {"input": "dog", "dimensions": 8}, "dimensions"),  # not a Matryoshka model
    (0, "/v1/embeddings", {"input": "dog", "encoding_format": "int8"}, "encoding_format"),
    (1, "/v1/score", {"text_1": QUERY, "text_2": ["paris " * 70]}, "text_2"),  # the pair is too long
    (1, "/v1/score", {"text_1": QUERY, "text_2": [""]}, "text_2"),
    (1, "/v1/score", {"text_1": QUERY, "text_2": 3}, "text_2"),
    (1, "/v1/rerank", {"query": QUERY, "documents": []}, "documents"),
    (1, "/v1/rerank", {"query": QUERY, "documents": ["b"], "top_n": "two"}, "top_n"),
])
def test_bad_input_is_a_400_naming_the_field(servers, which, path, body, param):
    r = _post(servers[which], path, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].split(".")[0] == param, r.text  # pydantic adds the type it tried


def test_each_server_refuses_what_its_model_does_not_do_and_carries_on(servers):
    embed, rerank = servers
    for server in servers:
        r = _post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 2})
        assert r.status_code == 400 and "--runner generate" in r.json()["error"]["message"], r.text
        r = _post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400, r.text
    r = _post(rerank, "/v1/embeddings", {"input": "hi"})
    assert r.status_code == 400 and "cross-encoder" in r.json()["error"]["message"], r.text
    cut = _post(rerank, "/v1/score", {"text_1": QUERY, "text_2": ["paris " * 70], "truncate_prompt_tokens": 20})
    assert cut.status_code == 200 and cut.json()["usage"]["prompt_tokens"] == 20, cut.text
    assert _post(embed, "/v1/embeddings", {"input": "hi"}).status_code == 200
    assert _post(rerank, "/v1/rerank", {"query": "a", "documents": ["b"]}).status_code == 200
    for server in servers:  # what a generation server reports, an encoder's reports too
        assert httpx.get(server.url + "/v1/models").json()["data"][0]["id"] == "tiny"
        assert "num_requests_waiting" in httpx.get(server.url + "/metrics").text
        assert httpx.get(server.url + "/ledger").json()["weights_bytes"] > 0
