"""LoRA adapters through `tally serve` and the official `openai` client: a request picks its adapter by `model`,
requests for three adapters and the base at once each get their own model's tokens (PEFT's merged model's), adapters
are listed in /v1/models with their parent, loaded and unloaded at run time behind vLLM's switch (404 without it),
and bad names and adapters get clear errors while the server carries on."""
from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from support.lora_adapters import ALL_TARGETS, make_adapter, merged_greedy
from support.servers import started
from tally.server.process import ServerProcess

MAX_TOKENS = 10
PROMPT = [40, 41, 100, 7, 250, 33, 90, 12, 19, 300, 5, 61]
FLAGS = ["--served-model-name", "tiny", "--dtype", "float32", "--kv-cache-memory", "8MB", "--log-level", "warning"]


@pytest.fixture(scope="module")
def adapters(tiny_llama, tmp_path_factory):
    d = tmp_path_factory.mktemp("lora-server")
    return {"qv": make_adapter(tiny_llama, d / "qv", 1, ["q_proj", "v_proj"]),
            "all": make_adapter(tiny_llama, d / "all", 2, ALL_TARGETS, r=4),
            "mlp": make_adapter(tiny_llama, d / "mlp", 3, ["gate_proj", "down_proj"], r=16),
            "too_big": make_adapter(tiny_llama, d / "big", 4, ["q_proj"], r=32)}


@pytest.fixture(scope="module")
def expected(tiny_llama, adapters):
    tok = AutoTokenizer.from_pretrained(tiny_llama)
    return {name: tok.decode(merged_greedy(tiny_llama, adapters.get(name), [PROMPT], MAX_TOKENS)[0],
                             skip_special_tokens=True) for name in ("tiny", "qv", "all", "mlp")}


@pytest.fixture(scope="module")
def servers(tiny_llama, adapters):
    """One serving adapters with runtime updates allowed; one plain, without the switch."""
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH")]))}
    lora = ServerProcess([str(tiny_llama), *FLAGS, "--enable-lora", "--max-loras", "3", "--max-cpu-loras", "4",
                          "--lora-modules", f"qv={adapters['qv']}",
                          json.dumps({"name": "all", "path": str(adapters["all"]), "base_model_name": "tiny"})],
                         env={**env, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"})
    plain = ServerProcess([str(tiny_llama), *FLAGS], env=env)
    with started(lora, plain) as pair:
        yield pair


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)


def complete(server, model: str) -> openai.types.Completion:
    return client(server).completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                                             extra_body={"ignore_eos": True})


def test_adapters_are_listed_with_their_parent(servers, adapters):
    models = {m.id: m for m in client(servers[0]).models.list().data}
    assert set(models) == {"tiny", "qv", "all"}
    assert models["qv"].parent == "tiny" and models["qv"].root == str(adapters["qv"])
    assert models["all"].parent == "tiny"


def test_requests_for_three_adapters_and_the_base_at_once_each_get_their_own_models_tokens(servers, adapters,
                                                                                             expected):
    server = servers[0]
    loaded = httpx.post(server.url + "/v1/load_lora_adapter",
                        json={"lora_name": "mlp", "lora_path": str(adapters["mlp"])})
    assert loaded.status_code == 200, loaded.text
    names = ["tiny", "qv", "all", "mlp"] * 2
    with ThreadPoolExecutor(len(names)) as pool:
        outs = list(pool.map(lambda name: complete(server, name), names))
    assert [o.choices[0].text for o in outs] == [expected[n] for n in names]
    assert [o.model for o in outs] == names
    chat = client(server).chat.completions.create(model="qv", messages=[{"role": "user", "content": "hi"}],
                                                  max_tokens=3)
    assert chat.model == "qv"


def test_bad_names_and_adapters_get_clear_errors_and_the_server_carries_on(servers, adapters, expected):
    server = servers[0]
    with pytest.raises(openai.NotFoundError, match="The model `nope` does not exist"):
        complete(server, "nope")
    too_big = httpx.post(server.url + "/v1/load_lora_adapter",
                         json={"lora_name": "big", "lora_path": str(adapters["too_big"])})
    assert too_big.status_code == 400 and "--max-lora-rank ≥ 32" in too_big.json()["error"]["message"]
    again = httpx.post(server.url + "/v1/load_lora_adapter", json={"lora_name": "qv", "lora_path": "/x"})
    assert again.status_code == 400 and "already been loaded" in again.json()["error"]["message"]
    unknown_field = httpx.post(server.url + "/v1/load_lora_adapter", json={"lora_name": "z", "lora_path": "/x",
                                                                            "lora_int_id": 3})
    assert unknown_field.status_code == 400 and "lora_int_id" in unknown_field.json()["error"]["message"]
    missing = httpx.post(server.url + "/v1/load_lora_adapter", json={"lora_name": "z", "lora_path": "/no/such"})
    assert missing.status_code == 400 and "has no adapter_config.json" in missing.json()["error"]["message"]
    assert httpx.post(server.url + "/v1/unload_lora_adapter", json={"lora_name": "nope"}).status_code == 404
    assert httpx.post(server.url + "/v1/unload_lora_adapter", json={"lora_name": "all"}).status_code == 200
    with pytest.raises(openai.NotFoundError):
        complete(server, "all")
    assert "all" not in {m.id for m in client(server).models.list().data}
    assert complete(server, "qv").choices[0].text == expected["qv"]
    with pytest.raises(openai.BadRequestError, match="LoRA adapters serve generation only"):
        client(server).embeddings.create(model="qv", input="hi")


def test_runtime_updates_need_the_switch(servers):
    plain = servers[1]
    assert httpx.post(plain.url + "/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": "/x"}).status_code \
        == 404
    with pytest.raises(openai.NotFoundError, match="The model `qv` does not exist"):
        complete(plain, "qv")
