"""The Prometheus series read beyond the server that serves them: their names (vLLM's, without the prefix), the two
prefixes they come under, and the older vLLM names a reader falls back on. The server's /metrics, the load
generator's scrape and the canary router's backend reader all take them from here."""
from __future__ import annotations

METRICS_PREFIXES = {"tally": "tally:", "vllm": "vllm:"}  # --metrics-prefix NAME → the series' prefix

NUM_REQUESTS_RUNNING = "num_requests_running"
NUM_REQUESTS_WAITING = "num_requests_waiting"
KV_CACHE_USAGE_PERC = "kv_cache_usage_perc"
KV_CACHE_FRAGMENTATION_PERC = "kv_cache_fragmentation_perc"
NUM_PREEMPTIONS = "num_preemptions"
SPEC_DECODE_NUM_DRAFTS = "spec_decode_num_drafts"
SPEC_DECODE_NUM_DRAFT_TOKENS = "spec_decode_num_draft_tokens"
SPEC_DECODE_NUM_ACCEPTED_TOKENS = "spec_decode_num_accepted_tokens"
SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS = "spec_decode_num_accepted_tokens_per_pos"  # label position
# The adaptive speculation policy's own counts (no vLLM peer): what its measuring cost, read by
# benchmarks/speculative.py --server to wait until a server's measuring is repaid
SPEC_DECODE_POLICY_STEPS = "spec_decode_policy_steps"
SPEC_DECODE_POLICY_MEASURING_STEPS = "spec_decode_policy_measuring_steps"
SPEC_DECODE_POLICY_SPECULATING_STEPS = "spec_decode_policy_speculating_steps"
SPEC_DECODE_POLICY_LOST_OFF_STEPS = "spec_decode_policy_lost_off_steps"
DECODE_STEP_SECONDS = "decode_step_seconds"
DECODE_STEP_TOKENS = "decode_step_tokens"
TIME_TO_FIRST_TOKEN_SECONDS = "time_to_first_token_seconds"
INTER_TOKEN_LATENCY_SECONDS = "inter_token_latency_seconds"
REQUEST_TIME_PER_OUTPUT_TOKEN_SECONDS = "request_time_per_output_token_seconds"
E2E_REQUEST_LATENCY_SECONDS = "e2e_request_latency_seconds"
REQUEST_QUEUE_TIME_SECONDS = "request_queue_time_seconds"
REQUEST_GENERATION_TOKENS = "request_generation_tokens"
# Counters, as prometheus_client names their families: the served series end in _total
REQUEST_SUCCESS = "request_success"
REQUEST_REJECTED = "request_rejected"
REQUEST_TIMEOUT = "request_timeout"
REQUEST_ERROR = "request_error"

# vLLM's older names, which a Tally server under vllm: serves as well because vLLM's Grafana dashboard queries them.
# vLLM renamed its per-token time_per_output_token_seconds to inter_token_latency_seconds, and the server serves it
# so; an older vLLM has no per-request TPOT, and a reader takes its per-token time in that one's place.
GPU_CACHE_USAGE_PERC = "gpu_cache_usage_perc"
TIME_PER_OUTPUT_TOKEN_SECONDS = "time_per_output_token_seconds"
VLLM_ALIASES = {KV_CACHE_USAGE_PERC: (GPU_CACHE_USAGE_PERC,),
                REQUEST_TIME_PER_OUTPUT_TOKEN_SECONDS: (TIME_PER_OUTPUT_TOKEN_SECONDS,)}

# Served without a prefix: prometheus_client's process collector, and vLLM's API server's
# prometheus-fastapi-instrumentator (a counter by handler and status)
PROCESS_RESIDENT_MEMORY_BYTES = "process_resident_memory_bytes"
HTTP_REQUESTS = "http_requests"


def spellings(name: str) -> tuple[str, ...]:
    """The names a server may serve `name` under, best first: its own, then an older vLLM's."""
    return (name, *VLLM_ALIASES.get(name, ()))
