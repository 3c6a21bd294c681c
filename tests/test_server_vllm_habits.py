"""vLLM users' habits that work unchanged: `tally serve MODEL`, `--api-key` / `VLLM_API_KEY`, `/version`, fields
the server does not implement refused by name instead of silently dropped, and `--metrics-prefix vllm` serving every
series vLLM's own Grafana dashboard queries."""
from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.servers import started

from tally.engine.snapshot import EngineSnapshot, IterationTokens
from tally.server.metrics import METRICS_PREFIXES, ServerMetrics
from tally.server.process import ServerProcess
from tally.version import __version__

KEY = "sk-test-0123456789"


@pytest.fixture(scope="module")
def servers(tiny_llama) -> dict[str, ServerProcess]:
    """The file's servers, started side by side. keyed: the model given positionally, as `vllm serve MODEL` takes it,
    the key from vLLM's variable. vllm_command_line: one from vLLM's docs, GPU-only flags and vLLM's dtype spelling
    included. vllm_metrics: --metrics-prefix vllm."""
    tiny = str(tiny_llama)
    with started(ServerProcess([tiny, "--served-model-name", "tiny", "tiny-alias", "--dtype", "float32",
                                "--max-model-len", "256", "--kv-cache-memory", "8MB", "--log-level", "warning"],
                               env={"VLLM_API_KEY": KEY}),
                 ServerProcess([tiny, "--dtype", "half", "--gpu-memory-utilization", "0.9", "--enforce-eager",
                                "--tensor-parallel-size", "1", "--max-model-len", "256", "--kv-cache-memory", "8MB",
                                "--served-model-name", "tiny"]),
                 ServerProcess([tiny, "--served-model-name", "tiny", "--dtype", "float32", "--max-model-len", "256",
                                "--kv-cache-memory", "8MB", "--log-level", "warning", "--metrics-prefix",
                                "vllm"])) as s:
        yield dict(zip(("keyed", "vllm_command_line", "vllm_metrics"), s))


@pytest.fixture(scope="module")
def server(servers):
    return servers["keyed"]


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


def test_a_vllm_command_line_runs_unchanged(servers):
    """From vLLM's docs: GPU-only flags are named in one warning; vLLM's dtype spelling is understood."""
    server = servers["vllm_command_line"]
    r = httpx.post(server.base_url + "/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 200, r.text
    log = server.log()
    assert "ignoring vLLM flags that have no effect on this CPU engine: --gpu-memory-utilization, " \
           "--enforce-eager" in log
    assert "prompt + 2 output tokens, length" in log  # the access line at info, one per request


# Every series vLLM's own Grafana dashboard queries: the metric names in the PromQL of
# examples/online_serving/prometheus_grafana/grafana.json in vllm-project/vllm (commit 004f771f3a6b), copied here;
# vLLM is Apache-2.0 licensed (https://github.com/vllm-project/vllm/blob/main/LICENSE). Its model_name variable is
# label_values({__name__=~"vllm:.*"}, model_name).
VLLM_DASHBOARD_SERIES = (
    "vllm:e2e_request_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_sum",
    "vllm:e2e_request_latency_seconds_count", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
    "vllm:time_per_output_token_seconds_bucket", "vllm:time_per_output_token_seconds_sum",
    "vllm:time_per_output_token_seconds_count", "vllm:num_requests_running", "vllm:num_requests_waiting",
    "vllm:time_to_first_token_seconds_bucket", "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count", "vllm:gpu_cache_usage_perc", "vllm:request_prompt_tokens_bucket",
    "vllm:request_generation_tokens_bucket", "vllm:request_success_total", "vllm:request_queue_time_seconds_sum",
    "vllm:request_prefill_time_seconds_sum", "vllm:request_decode_time_seconds_sum",
    "vllm:request_max_num_generation_tokens_sum",
)


def test_metrics_prefix_vllm_serves_every_series_vllms_dashboard_queries(servers):
    server = servers["vllm_metrics"]
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    client.completions.create(model="tiny", prompt="hi", max_tokens=3, n=2, extra_body={"ignore_eos": True})
    for _ in client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=4, stream=True):
        pass
    text = httpx.get(server.url + "/metrics").text
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    names = {s.name for s in samples}
    assert set(VLLM_DASHBOARD_SERIES) <= names, sorted(set(VLLM_DASHBOARD_SERIES) - names)
    assert all(s.labels.get("model_name") == "tiny" for s in samples if s.name.startswith("vllm:"))
    value = {(s.name, s.labels.get("endpoint")): s.value for s in samples}
    assert value["vllm:request_max_num_generation_tokens_sum", "/v1/completions"] == 3  # the longer of n=2
    assert value["vllm:request_params_n_sum", "/v1/completions"] == 2
    assert value["vllm:request_params_max_tokens_sum", "/v1/chat/completions"] == 4
    assert value["vllm:request_inference_time_seconds_count", "/v1/chat/completions"] == 1
    assert value["vllm:time_per_output_token_seconds_count", "/v1/chat/completions"] == \
        value["vllm:inter_token_latency_seconds_count", "/v1/chat/completions"] > 0
    (info,) = [s for s in samples if s.name == "vllm:cache_config_info"]
    assert info.value == 1 and info.labels["block_size"] == "16" and int(info.labels["num_gpu_blocks"]) > 0
    assert info.labels["cache_dtype"] == "auto" and info.labels["enable_prefix_caching"] == "True"
    # every step counted: at least the two prompts' steps and the tokens generated after them
    assert value["vllm:iteration_tokens_total_count", None] >= 2 + 3 - 1 + 4 - 1
    assert not any(n.startswith("tally:") for n in names)
    assert not any(n.endswith("_created") for n in names)


def test_iteration_tokens_are_served_in_vllms_buckets_under_either_prefix():
    steps = IterationTokens().observe(1).observe(8).observe(9).observe(300)  # decodes, a chunk of prompt
    for prefix in METRICS_PREFIXES.values():
        text = ServerMetrics("m", lambda: EngineSnapshot(iteration_tokens=steps), prefix).render().decode()
        buckets = {s.labels["le"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
                   if s.name == prefix + "iteration_tokens_total_bucket"}
        assert (buckets["1.0"], buckets["8.0"], buckets["16.0"], buckets["256.0"], buckets["512.0"]) == (1, 2, 3, 3, 4)
        assert buckets["+Inf"] == 4 and f"{prefix}iteration_tokens_total_sum{{model_name=\"m\"}} 318.0" in text
        assert (prefix + "gpu_cache_usage_perc" in text) == (prefix == "vllm:")  # vLLM's old name, for its dashboard
    assert "iteration_tokens_total" not in ServerMetrics("m", EngineSnapshot).render().decode()  # not counted


def test_every_token_after_a_streams_first_counts_once_in_the_itl_histogram():
    """A first chunk of 3 tokens (a stream writes the latest output when it gets to) adds 2 gaps of 0, its first token
    being TTFT's; a later chunk of 2 adds its wait and one 0: 4 gaps for 5 tokens, however they were grouped."""
    metrics = ServerMetrics("m", EngineSnapshot)
    metrics.observe_itl("/v1/completions", None, 3)
    metrics.observe_itl("/v1/completions", 0.25, 2)
    samples = {(s.name, s.labels.get("endpoint")): s.value
               for f in text_string_to_metric_families(metrics.render().decode()) for s in f.samples}
    assert samples["tally:inter_token_latency_seconds_count", "/v1/completions"] == 4
    assert samples["tally:inter_token_latency_seconds_sum", "/v1/completions"] == 0.25
