"""`--generation-config` (vLLM's): a checkpoint's generation_config.json sets the sampling defaults of requests
that leave them unset; `vllm` ignores it; a request's own values win."""
from __future__ import annotations

import json
import shutil

import httpx
import pytest

from tally import LLM
from tally.errors import ConfigError
from tally.server.process import ServerProcess


@pytest.fixture(scope="module")
def greedy_by_default(tiny_llama, tmp_path_factory):
    """The tiny checkpoint with a generation_config.json that makes sampling greedy (top_k 1)."""
    out = tmp_path_factory.mktemp("gen") / "ckpt"
    shutil.copytree(tiny_llama, out)
    (out / "generation_config.json").write_text(json.dumps({"top_k": 1, "temperature": 0.9, "do_sample": True}))
    return out


def test_the_checkpoints_defaults_apply_and_vllm_turns_them_off(greedy_by_default):
    llm = LLM(str(greedy_by_default), dtype="float32", kv_cache_memory=4_000_000)
    assert llm.engine.sampling_defaults == {"top_k": 1, "temperature": 0.9}
    defaults = llm.get_default_sampling_params()
    assert (defaults.top_k, defaults.temperature) == (1, 0.9)
    assert LLM(str(greedy_by_default), dtype="float32", kv_cache_memory=4_000_000,
               generation_config="vllm").engine.sampling_defaults == {}
    with pytest.raises(ConfigError, match="no generation_config.json"):
        LLM(str(greedy_by_default), dtype="float32", kv_cache_memory=4_000_000, generation_config="/nonexistent")


def test_the_server_fills_unset_fields_from_it(greedy_by_default):
    with ServerProcess([str(greedy_by_default), "--served-model-name", "tiny", "--dtype", "float32",
                        "--kv-cache-memory", "8MB", "--log-level", "warning"]) as server:
        def text(**kw) -> str:
            body = {"model": "tiny", "prompt": "hello there", "max_tokens": 8, "seed": 1, **kw}
            return httpx.post(server.base_url + "/completions", json=body, timeout=60).json()["choices"][0]["text"]
        # top_k 1 from the file makes every seed give the greedy text; the request's own top_k wins.
        assert text() == text(seed=2) == text(temperature=0)
        assert len({text(seed=s, top_k=0) for s in range(4)}) > 1
