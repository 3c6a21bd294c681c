"""vLLM users' habits that work unchanged: `tally serve MODEL`, `--api-key` / `VLLM_API_KEY`, `/version`, and fields
the server does not implement refused by name instead of silently dropped."""
from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tally.server.process import ServerProcess
from tally.version import __version__

KEY = "sk-test-0123456789"


@pytest.fixture(scope="module")
def server(tiny_llama):
    """The model given positionally, as `vllm serve MODEL` takes it; the key from vLLM's variable."""
    with ServerProcess([str(tiny_llama), "--served-model-name", "tiny", "tiny-alias", "--dtype", "float32",
                        "--max-model-len", "256", "--kv-cache-memory", "8MB", "--log-level", "warning"],
                       env={"VLLM_API_KEY": KEY}) as s:
        yield s


def test_the_api_key_guards_v1_and_leaves_health_and_metrics_open(server):
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
    assert httpx.post(server.base_url + "/completions", json=body).status_code == 401
    wrong = httpx.post(server.base_url + "/completions", json=body, headers={"authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
    client = openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0)
    assert client.completions.create(model="tiny", prompt="hi", max_tokens=2).usage.completion_tokens == 2
    assert [m.id for m in client.models.list()] == ["tiny", "tiny-alias"]  # vLLM's several served names
    assert client.completions.create(model="tiny-alias", prompt="hi", max_tokens=2).model == "tiny"
    for path in ("/health", "/metrics", "/version"):
        assert httpx.get(server.url + path).status_code == 200, path
    assert httpx.get(server.url + "/version").json() == {"version": __version__}


@pytest.mark.parametrize("extra, named", [
    ({"functions": [{"name": "f", "parameters": {}}]}, "functions"),
    ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
])
def test_an_unimplemented_field_is_refused_by_name(server, extra, named):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **extra}
    r = httpx.post(server.base_url + "/chat/completions", json=body, headers={"authorization": f"Bearer {KEY}"})
    assert r.status_code == 400 and r.json()["error"]["param"] == named, r.text


def test_caller_metadata_is_accepted(server):
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 2, "user": "u1", "metadata": {"team": "a"},
            "tool_choice": "none"}
    r = httpx.post(server.base_url + "/completions", json=body, headers={"authorization": f"Bearer {KEY}"})
    assert r.status_code == 200, r.text


def test_a_vllm_command_line_runs_unchanged(tiny_llama):
    """From vLLM's docs: GPU-only flags are named in one warning; vLLM's dtype spelling is understood."""
    flags = [str(tiny_llama), "--dtype", "half", "--gpu-memory-utilization", "0.9", "--enforce-eager",
             "--tensor-parallel-size", "1", "--max-model-len", "256", "--kv-cache-memory", "8MB",
             "--served-model-name", "tiny"]
    with ServerProcess(flags) as server:
        r = httpx.post(server.base_url + "/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 200, r.text
        log = server.log()
        assert "ignoring vLLM flags that have no effect on this CPU engine: --gpu-memory-utilization, " \
               "--enforce-eager" in log
        assert "prompt + 2 output tokens, length" in log  # the access line at info, one per request


def test_metrics_prefix_vllm_serves_vllms_names_and_no_created_series(tiny_llama):
    with ServerProcess([str(tiny_llama), "--served-model-name", "tiny", "--dtype", "float32", "--max-model-len", "256",
                        "--kv-cache-memory", "8MB", "--log-level", "warning", "--metrics-prefix", "vllm"]) as server:
        httpx.post(server.base_url + "/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2})
        text = httpx.get(server.url + "/metrics").text
    names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    for name in ("vllm:time_to_first_token_seconds_bucket", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                 "vllm:generation_tokens_total", "vllm:request_success_total", "vllm:prefix_cache_hits_total"):
        assert name in names, name
    assert not any(n.startswith("tally:") for n in names)
    assert not any(n.endswith("_created") for n in names)
