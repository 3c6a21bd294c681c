"""/v1/embeddings through the official `openai` client, /v1/score and the rerank routes through httpx, against a
real `tally serve --runner pooling` (a tiny Qwen3 read as an embedding model) beside a generative one: vectors match
transformers' last hidden state, base64 and float agree, scores are the cosines, rerank orders by them; bad input
gets a 400 naming the field and the server carries on; each server refuses the other task's endpoints."""
from __future__ import annotations

import base64

import httpx
import numpy as np
import openai
import pytest
import torch
import torch.nn.functional as F
from support.servers import started

from tally.server.process import ServerProcess

COMMON = ["--served-model-name", "tiny", "--dtype", "float32", "--max-model-len", "64", "--kv-cache-memory", "4MB",
          "--log-level", "warning", "--max-num-seqs", "4"]
TEXTS = ["Paris is the capital of France.", "The quick brown fox jumps over the lazy dog.", "def add(a, b):"]


@pytest.fixture(scope="module")
def servers(tiny_model_factory):
    pooling = ServerProcess([str(tiny_model_factory("qwen3")), *COMMON, "--runner", "pooling",
                             "--max-num-batched-tokens", "16", "--pooler-config", '{"is_matryoshka": true}'])
    generate = ServerProcess([str(tiny_model_factory("llama")), *COMMON])
    with started(pooling, generate):
        yield pooling, generate


@pytest.fixture(scope="module")
def reference(tiny_model_factory):
    """Texts → transformers' last-token hidden state (unnormalised) and the token ids it read."""
    import transformers

    path = tiny_model_factory("qwen3")
    tok = transformers.AutoTokenizer.from_pretrained(path)
    hf = transformers.AutoModel.from_pretrained(path, dtype=torch.float32).eval()

    def embed(text: str | list[int]) -> torch.Tensor:
        ids = tok.encode(text) if isinstance(text, str) else text
        with torch.no_grad():
            return hf(torch.tensor([ids])).last_hidden_state[0, -1]
    embed.encode = tok.encode
    return embed


def _post(server: ServerProcess, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=120)


def test_openai_client_embeddings_match_transformers(servers, reference):
    client = openai.OpenAI(base_url=servers[0].base_url, api_key="none", max_retries=0)
    got = client.embeddings.create(model="tiny", input=TEXTS)  # the client asks for base64 and decodes it
    assert [d.index for d in got.data] == [0, 1, 2]
    for text, d in zip(TEXTS, got.data):
        assert np.abs(np.array(d.embedding) - F.normalize(reference(text), dim=0).numpy()).max() < 1e-5
    n_tokens = sum(len(reference.encode(t)) for t in TEXTS)
    assert (got.usage.prompt_tokens, got.usage.total_tokens) == (n_tokens, n_tokens)
    as_floats = client.embeddings.create(model="tiny", input=TEXTS[0], encoding_format="float")
    assert np.allclose(as_floats.data[0].embedding, got.data[0].embedding, atol=1e-6)  # alone vs batched
    ids = [reference.encode(t) for t in TEXTS[:2]]
    by_ids = client.embeddings.create(model="tiny", input=ids)
    assert np.allclose([d.embedding for d in by_ids.data], [d.embedding for d in got.data[:2]], atol=1e-6)
    one = client.embeddings.create(model="tiny", input=ids[1], dimensions=8, user="someone")
    assert np.allclose(one.data[0].embedding, F.normalize(reference(ids[1])[:8], dim=0).numpy(), atol=1e-5)
    raw = _post(servers[0], "/v1/embeddings", {"input": TEXTS[0], "encoding_format": "base64"}).json()
    assert np.array_equal(np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4"),
                          np.array(as_floats.data[0].embedding, dtype=np.float32))  # the same request, alone


def test_score_and_rerank_are_cosines_of_embeddings(servers, reference):
    server = servers[0]
    vec = {t: F.normalize(reference(t), dim=0) for t in TEXTS}
    cos = {(a, b): float(vec[a] @ vec[b]) for a in TEXTS for b in TEXTS}
    one_to_many = _post(server, "/v1/score", {"model": "tiny", "text_1": TEXTS[0], "text_2": TEXTS}).json()
    assert [d["score"] for d in one_to_many["data"]] == pytest.approx([cos[TEXTS[0], t] for t in TEXTS], abs=1e-5)
    assert one_to_many["object"] == "list" and one_to_many["data"][0]["object"] == "score"
    pairwise = _post(server, "/score", {"text_1": TEXTS[:2], "text_2": TEXTS[1:]}).json()
    assert [d["score"] for d in pairwise["data"]] == pytest.approx([cos[TEXTS[0], TEXTS[1]],
                                                                     cos[TEXTS[1], TEXTS[2]]], abs=1e-5)
    order = sorted(range(3), key=lambda i: -cos[TEXTS[0], TEXTS[i]])
    for path in ("/v1/rerank", "/rerank", "/v2/rerank"):
        docs = [{"text": t} for t in TEXTS] if path == "/v2/rerank" else TEXTS
        ranked = _post(server, path, {"model": "tiny", "query": TEXTS[0], "documents": docs, "top_n": 2}).json()
        assert [r["index"] for r in ranked["results"]] == order[:2]
        assert ranked["results"][0]["document"] == {"text": TEXTS[order[0]]}
        assert ranked["results"][0]["relevance_score"] == pytest.approx(cos[TEXTS[0], TEXTS[order[0]]], abs=1e-5)
    bare = _post(server, "/v1/rerank", {"query": TEXTS[0], "documents": TEXTS, "return_documents": False}).json()
    assert [r["index"] for r in bare["results"]] == order and "document" not in bare["results"][0]


@pytest.mark.parametrize("path, body, param", [
    ("/v1/embeddings", {"input": ""}, "input"),
    ("/v1/embeddings", {"input": []}, "input"),
    ("/v1/embeddings", {"input": ["a"] * 200}, "input"),  # more than max(--max-num-seqs, 128)
    ("/v1/embeddings", {"input": [[1, 2, 99999]]}, "input"),
    ("/v1/embeddings", {"input": [1, "a"]}, "input"),
    ("/v1/embeddings", {"input": "fox " * 100}, "input"),  # longer than --max-model-len 64
    ("/v1/embeddings", {"input": "fox", "dimensions": 65}, "dimensions"),  # hidden size is 64
    ("/v1/embeddings", {"input": "fox", "dimensions": 0}, "dimensions"),
    ("/v1/embeddings", {"input": "fox", "encoding_format": "int8"}, "encoding_format"),
    ("/v1/embeddings", {"input": "fox", "extra": 1}, "extra"),
    ("/v1/score", {"text_1": "a", "text_2": ["b", "c"], "temperature": 0}, "temperature"),
    ("/v1/score", {"text_1": ["a", "b"], "text_2": ["b", "c", "d"]}, "text_2"),
    ("/v1/score", {"text_1": "", "text_2": "b"}, "text_1"),
    ("/v1/rerank", {"query": "a", "documents": []}, "documents"),
    ("/v1/rerank", {"query": "a", "documents": ["b"], "top_n": -1}, "top_n"),
    ("/v1/rerank", {"query": "a", "documents": ["b"], "max_chunks_per_doc": 2}, "max_chunks_per_doc"),
])
def test_bad_input_is_a_400_naming_the_field(servers, path, body, param):
    r = _post(servers[0], path, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


def test_each_server_refuses_the_other_task_and_carries_on(servers):
    pooling, generate = servers
    r = _post(pooling, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and "--runner generate" in r.json()["error"]["message"]
    r = _post(pooling, "/v1/completions", {"prompt": "hi", "max_tokens": 2})
    assert r.status_code == 400
    for path, body in [("/v1/embeddings", {"input": "hi"}), ("/v1/score", {"text_1": "a", "text_2": "b"}),
                       ("/v1/rerank", {"query": "a", "documents": ["b"]})]:
        r = _post(generate, path, body)
        assert r.status_code == 400 and "--runner pooling" in r.json()["error"]["message"], r.text
    assert _post(generate, "/v1/completions", {"prompt": "hi", "max_tokens": 2}).status_code == 200
    assert _post(pooling, "/v1/embeddings", {"input": "hi"}).status_code == 200
