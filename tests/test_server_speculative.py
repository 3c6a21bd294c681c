"""`tally serve --speculative-config` (vLLM's flag): streamed text is exactly the plain server's, stop strings hold
when they land inside a verified proposal, and the spec_decode counters reach /metrics and /ledger; the same with a
draft model (the target as its own draft: every proposal holds), whose weights and KV show in /ledger."""
from __future__ import annotations

import json

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.servers import started

from tally.bench.cli import main as bench_main
from tally.server.process import ServerProcess

FLAGS = ["--served-model-name", "tiny", "--dtype", "float32", "--max-model-len", "256", "--kv-cache-memory", "8MB",
         "--log-level", "warning"]
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
         "adaptive": False}
PROMPTS = ["the cat sat on the mat and the cat sat on the", "one two three one two three one two",
           "abc abc abc abc", "hello world, hello world, hello"]


@pytest.fixture(scope="module")
def servers(tiny_llama):
    """Plain, n-gram speculation, and a draft model."""
    draft = {"method": "draft_model", "model": str(tiny_llama), "num_speculative_tokens": 3, "adaptive": False}
    with started(ServerProcess([str(tiny_llama), *FLAGS]),
                 ServerProcess([str(tiny_llama), *FLAGS, "--speculative-config", json.dumps(NGRAM)]),
                 ServerProcess([str(tiny_llama), *FLAGS, "--speculative-config", json.dumps(draft)])) as s:
        yield s


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)


def _streamed(server, prompt: str, **kw) -> tuple[str, str | None]:
    text, reason = "", None
    for chunk in _client(server).completions.create(model="tiny", prompt=prompt, stream=True,
                                                     temperature=0, max_tokens=40, **kw):
        text += chunk.choices[0].text
        reason = chunk.choices[0].finish_reason or reason
    return text, reason


def test_streamed_text_and_stops_are_the_plain_servers(servers):
    plain, spec, _ = servers
    for prompt in PROMPTS:
        full, _ = _streamed(plain, prompt)
        assert _streamed(spec, prompt) == (full, "length")
        if len(full) > 12:
            stop = full[len(full) // 2:len(full) // 2 + 3]
            assert _streamed(spec, prompt, stop=[stop]) == _streamed(plain, prompt, stop=[stop])
            whole = _client(spec).completions.create(model="tiny", prompt=prompt, temperature=0,
                                                     max_tokens=40, stop=[stop])
            assert (whole.choices[0].text, whole.choices[0].finish_reason) == _streamed(plain, prompt, stop=[stop])


def test_draft_model_streams_the_plain_servers_text(servers):
    plain, _, draft_server = servers
    for prompt in PROMPTS:
        full, _ = _streamed(plain, prompt)
        assert _streamed(draft_server, prompt) == (full, "length")
        stop = full[len(full) // 2:len(full) // 2 + 3]
        assert _streamed(draft_server, prompt, stop=[stop]) == _streamed(plain, prompt, stop=[stop])
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(draft_server.url + "/metrics").text)}
    drafts = families["tally:spec_decode_num_draft_tokens"].samples[0].value
    assert drafts > 0 and families["tally:spec_decode_num_accepted_tokens"].samples[0].value == drafts
    ledger = httpx.get(draft_server.url + "/ledger").json()
    assert ledger["plan"]["draft"]["weight_bytes"] > 0 and ledger["plan"]["draft"]["kv_bytes_per_token"] > 0


def test_spec_decode_counters_in_metrics_and_ledger(servers):
    plain, spec, _ = servers
    _streamed(spec, PROMPTS[0])
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(spec.url + "/metrics").text)}
    drafts = families["tally:spec_decode_num_draft_tokens"].samples[0].value
    accepted = families["tally:spec_decode_num_accepted_tokens"].samples[0].value
    assert drafts > 0 and 0 < accepted <= drafts
    per_pos = {s.labels["position"]: s.value for s in families["tally:spec_decode_num_accepted_tokens_per_pos"].samples
               if s.name.endswith("_total")}
    assert sum(per_pos.values()) == accepted and set(per_pos) == {"0", "1", "2", "3"}
    ledger = httpx.get(spec.url + "/ledger").json()["speculative_decoding"]
    assert ledger["num_accepted_tokens"] >= accepted and 0 < ledger["acceptance_rate"] <= 1
    plain_families = {f.name for f in text_string_to_metric_families(httpx.get(plain.url + "/metrics").text)}
    assert not any(name.startswith("tally:spec_decode") for name in plain_families)  # only when configured
    fixed_families = {f.name for f in text_string_to_metric_families(httpx.get(spec.url + "/metrics").text)}
    assert not any(name.startswith("tally:spec_decode_policy") for name in fixed_families)  # no policy at a fixed K


def test_tally_bench_reports_what_speculation_did(servers, tmp_path):
    _, spec, _ = servers
    out = tmp_path / "run.json"
    assert bench_main(["--url", spec.url, "--model", "tiny", "--concurrency", "2", "--requests", "6",
                       "--lengths", "fixed:16,24", "--out", str(out), "--quiet"]) == 0
    report = json.loads(out.read_text())["speculative_decoding"]
    assert report["draft_tokens"] > 0 and 0 <= report["accepted_tokens"] <= report["draft_tokens"]
