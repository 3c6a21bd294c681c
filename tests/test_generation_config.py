"""`--generation-config` (vLLM's): a checkpoint's generation_config.json sets the sampling defaults of requests
that leave them unset, its max_new_tokens their default max_tokens (the built-in model's: 512); `vllm` ignores it;
`--override-generation-config` goes on top of either; a request's own values win."""
from __future__ import annotations

import json
import re
import shutil

import httpx
import pytest
from support.servers import started

from tally import LLM
from tally.engine.config import EngineConfig
from tally.errors import ConfigError
from tally.models.generation_config import max_tokens_or_default, sampling_defaults
from tally.models.registry import resolve_model
from tally.server.process import ServerProcess


@pytest.fixture(scope="module")
def greedy_by_default(tiny_llama, tmp_path_factory):
    """The tiny checkpoint with a generation_config.json that makes sampling greedy (top_k 1)."""
    out = tmp_path_factory.mktemp("gen") / "ckpt"
    shutil.copytree(tiny_llama, out)
    (out / "generation_config.json").write_text(json.dumps({"top_k": 1, "temperature": 0.9, "do_sample": True}))
    return out


@pytest.fixture(scope="module")
def servers(greedy_by_default, tiny_llama):
    """The greedy checkpoint as it is; the tiny one in a short context with max_new_tokens set by the override.
    Started side by side."""
    flags = ["--served-model-name", "tiny", "--dtype", "float32", "--kv-cache-memory", "8MB", "--log-level", "warning"]
    with started(ServerProcess([str(greedy_by_default), *flags]),
                 ServerProcess([str(tiny_llama), *flags, "--max-model-len", "64",
                                "--override-generation-config", '{"max_new_tokens": 5}'])) as pair:
        yield pair


def test_the_checkpoints_defaults_apply_and_vllm_turns_them_off(greedy_by_default):
    llm = LLM(str(greedy_by_default), dtype="float32", kv_cache_memory=4_000_000)
    assert llm.engine.sampling_defaults == {"top_k": 1, "temperature": 0.9}
    defaults = llm.get_default_sampling_params()
    assert (defaults.top_k, defaults.temperature) == (1, 0.9)
    assert LLM(str(greedy_by_default), dtype="float32", kv_cache_memory=4_000_000,
               generation_config="vllm").engine.sampling_defaults == {}
    with pytest.raises(ConfigError, match="no generation_config.json"):
        LLM(str(greedy_by_default), dtype="float32", kv_cache_memory=4_000_000, generation_config="/nonexistent")


def test_the_server_fills_unset_fields_from_it(servers):
    def text(**kw) -> str:
        body = {"model": "tiny", "prompt": "hello there", "max_tokens": 8, "seed": 1, **kw}
        return httpx.post(servers[0].base_url + "/completions", json=body, timeout=60).json()["choices"][0]["text"]
    # top_k 1 from the file makes every seed give the greedy text; the request's own top_k wins.
    assert text() == text(seed=2) == text(temperature=0)
    assert len({text(seed=s, top_k=0) for s in range(4)}) > 1


def test_max_new_tokens_becomes_the_default_max_tokens_and_the_override_goes_on_top(greedy_by_default):
    assert sampling_defaults("auto", greedy_by_default, '{"max_new_tokens": 5, "top_k": 3}') == \
        {"top_k": 3, "temperature": 0.9, "max_tokens": 5}
    assert sampling_defaults("vllm", greedy_by_default, {"max_new_tokens": 5}) == {"max_tokens": 5}  # as vLLM
    assert sampling_defaults("auto", resolve_model(None).path) == {"max_tokens": 512}  # the built-in model's
    assert max_tokens_or_default(None, {"max_tokens": 512}, 100) == 100  # never past the context
    assert max_tokens_or_default(None, {}, 100) == 100 and max_tokens_or_default(7, {"max_tokens": 5}, 100) == 7


@pytest.mark.parametrize("override,says", [
    ('{"max_new_tokens": 0}', "max_new_tokens must be a whole number ≥ 1"),
    ('{"max_new_tokens": 2.5}', "max_new_tokens must be a whole number ≥ 1"),
    ('{"stop": ["x"]}', "key 'stop' is not one Tally applies"),
    ('{"top_p": "high"}', "top_p must be a number"),
    ("max_new_tokens=5", "is not JSON"),
    ("[5]", "must be a JSON object"),
])
def test_a_bad_override_is_refused_at_start_naming_what_to_fix(override, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        EngineConfig(override_generation_config=override)


def test_a_request_without_max_tokens_gets_the_default_within_the_context(servers):
    def generated(path: str, **body) -> tuple[int, str]:
        answer = httpx.post(servers[1].base_url + path, json={"model": "tiny", "ignore_eos": True, **body},
                            timeout=60).json()
        return answer["usage"]["completion_tokens"], answer["choices"][0]["finish_reason"]
    chat = {"messages": [{"role": "user", "content": "hello"}]}
    assert generated("/chat/completions", **chat) == (5, "length")
    assert generated("/chat/completions", **chat, max_tokens=7) == (7, "length")  # the request's own wins
    assert generated("/completions", prompt=[5] * 10, max_tokens=None) == (5, "length")
    assert generated("/completions", prompt=[5] * 61, max_tokens=None) == (3, "length")  # what the context left
