"""Prometheus metrics with vLLM's names under the `tally:` prefix, on a registry of the app's own (the names other
modules read are in tally/metric_names.py). Request metrics (labels model_name, endpoint) are observed when a request
ends, and every request to a generation endpoint ends in exactly one of success, rejected, error, timeout; engine
gauges and counters (label model_name) are read from the engine loop's latest snapshot at scrape time. Under `vllm:`
the two deprecated names that vLLM's own Grafana dashboard still queries are served as well."""
from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Callable, Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric

from tally.engine.config import EngineConfig
from tally.engine.kv_tiers.stats import DiskCacheStats, SwapStats
from tally.engine.snapshot import ITERATION_TOKEN_BUCKETS, EngineSnapshot, IterationTokens
from tally.engine.speculation.policy import Counters
from tally.engine.speculation.stats import SpeculationStats
from tally.metric_names import (
    DECODE_STEP_SECONDS,
    DECODE_STEP_TOKENS,
    E2E_REQUEST_LATENCY_SECONDS,
    GPU_CACHE_USAGE_PERC,
    INTER_TOKEN_LATENCY_SECONDS,
    KV_CACHE_FRAGMENTATION_PERC,
    KV_CACHE_USAGE_PERC,
    METRICS_PREFIXES,
    NUM_PREEMPTIONS,
    NUM_REQUESTS_RUNNING,
    NUM_REQUESTS_WAITING,
    REQUEST_ERROR,
    REQUEST_GENERATION_TOKENS,
    REQUEST_QUEUE_TIME_SECONDS,
    REQUEST_REJECTED,
    REQUEST_SUCCESS,
    REQUEST_TIME_PER_OUTPUT_TOKEN_SECONDS,
    REQUEST_TIMEOUT,
    SPEC_DECODE_NUM_ACCEPTED_TOKENS,
    SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS,
    SPEC_DECODE_NUM_DRAFT_TOKENS,
    SPEC_DECODE_NUM_DRAFTS,
    SPEC_DECODE_POLICY_LOST_OFF_STEPS,
    SPEC_DECODE_POLICY_MEASURING_STEPS,
    SPEC_DECODE_POLICY_SPECULATING_STEPS,
    SPEC_DECODE_POLICY_STEPS,
    TIME_PER_OUTPUT_TOKEN_SECONDS,
    TIME_TO_FIRST_TOKEN_SECONDS,
)
from tally.outputs import RequestOutput
from tally.server.errors import REJECTION_REASONS

# 1 ms to 10 min: a CPU decode step is tens of ms, a long queue on a small machine is minutes.
TIME_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
                  1.0, 1.5, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000)
# vLLM's buckets for its per-request phase times (request_latency_buckets in vllm/v1/metrics/loggers.py)
REQUEST_TIME_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                          240.0, 480.0, 960.0, 1920.0, 7680.0)
N_BUCKETS = (1, 2, 5, 10, 20)  # vLLM's for request_params_n
PREFIX = METRICS_PREFIXES["tally"]  # --metrics-prefix vllm serves the same series as vllm:, for vLLM's dashboards


@dataclass
class StreamTimes:
    """What the server saw of one engine request: when its first and last tokens were sent."""

    first_token_sent_s: float | None = None
    last_token_sent_s: float | None = None
    num_tokens_sent: int = 0


ENDPOINTS = ("/v1/completions", "/v1/chat/completions")


def cache_config_info(config: EngineConfig) -> dict[str, str]:
    """The KV cache settings vLLM's cache_config_info carries as labels and that exist here (the block count and
    size come from the engine's snapshot)."""
    return {"cache_dtype": config.kv_cache_dtype, "enable_prefix_caching": str(config.enable_prefix_caching),
            "num_gpu_blocks_override": str(config.num_gpu_blocks_override)}


class EngineCollector:
    def __init__(self, model_name: str, snapshot: Callable[[], EngineSnapshot], prefix: str = PREFIX,
                 cache_config: dict[str, str] | None = None) -> None:
        self.model_name = model_name
        self.snapshot = snapshot
        self.prefix = prefix
        self.cache_config = cache_config or {}

    def collect(self) -> Iterator:
        s, labels = self.snapshot(), [self.model_name]
        used_slots = s.num_used_blocks * s.block_size_tokens
        deprecated = [(GPU_CACHE_USAGE_PERC, f"DEPRECATED vLLM name of {KV_CACHE_USAGE_PERC}.", s.kv_usage)] \
            if self.prefix == METRICS_PREFIXES["vllm"] else []
        yield from _families((
            (NUM_REQUESTS_RUNNING, "Requests in the running batch.", s.num_running),
            (NUM_REQUESTS_WAITING, "Requests waiting to be scheduled.", s.num_waiting),
            (KV_CACHE_USAGE_PERC, "Used KV blocks / total KV blocks (0-1).", s.kv_usage),
            (KV_CACHE_FRAGMENTATION_PERC, "Allocated-but-unfilled KV slots / allocated slots (0-1).",
             s.num_unfilled_slots / used_slots if used_slots else 0.0),
            *deprecated,
        ), (), labels, self.prefix)
        # vLLM's info gauge: always 1, the settings in its labels (the KV pool here is in host memory)
        info = {**self.cache_config, "block_size": str(s.block_size_tokens), "num_gpu_blocks": str(s.num_blocks)}
        g = GaugeMetricFamily(self.prefix + "cache_config_info", "Information of the engine's KV cache config.",
                              labels=["model_name", *info])
        g.add_metric([*labels, *info.values()], 1.0)
        yield g
        if s.iteration_tokens is not None:
            yield _iteration_tokens(s.iteration_tokens, labels, self.prefix)
        yield from _families((), (
            ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", s.prefix_queried_tokens),
            ("prefix_cache_hits", "Prompt tokens found in the prefix cache (the disk tier's included).",
             s.prefix_hit_tokens),
            (NUM_PREEMPTIONS, "Requests preempted for lack of KV blocks.", s.num_preemptions),
            (DECODE_STEP_SECONDS, "Seconds in engine steps without a prompt chunk.", s.decode_step_seconds),
            (DECODE_STEP_TOKENS, "Tokens those steps generated.", s.decode_step_tokens),
        ), labels, self.prefix)
        if s.speculation is not None:
            yield from _speculation_metrics(s.speculation, labels, self.prefix)
        if s.speculation_policy is not None:
            yield from _policy_metrics(s.speculation_policy, labels, self.prefix)
        if s.swap is not None:
            yield from _swap_metrics(s.swap, labels, self.prefix)
        if s.disk_cache is not None:
            yield from _disk_cache_metrics(s.disk_cache, labels, self.prefix)


def _iteration_tokens(steps: IterationTokens, labels: list[str], prefix: str) -> HistogramMetricFamily:
    h = HistogramMetricFamily(prefix + "iteration_tokens_total", "Tokens per engine step (prompt + generated).",
                              labels=["model_name"])
    bounds = [str(float(b)) for b in ITERATION_TOKEN_BUCKETS] + ["+Inf"]
    h.add_metric(labels, list(zip(bounds, accumulate(steps.counts))), steps.total_tokens)
    return h


def _families(gauges: tuple, counters: tuple, labels: list[str], prefix: str) -> Iterator:
    """(name, help, value) rows as gauge, then counter, families of the one label model_name."""
    for family, rows in ((GaugeMetricFamily, gauges), (CounterMetricFamily, counters)):
        for name, doc, value in rows:
            f = family(prefix + name, doc, labels=["model_name"])
            f.add_metric(labels, value)
            yield f


def _swap_metrics(swap: SwapStats, labels: list[str], prefix: str) -> Iterator:
    """The swap space (--swap-space); num_requests_swapped and cpu_cache_usage_perc are vLLM V0's names for it."""
    yield from _families((
        ("num_requests_swapped", "Preempted requests whose KV blocks wait in the swap space.", swap.num_requests),
        ("cpu_cache_usage_perc", "Swap space held / its capacity (0-1).", swap.usage),
        ("kv_swap_space_bytes", "Bytes of KV blocks held in the swap space.", swap.held_bytes),
    ), (
        ("kv_swapped_out_blocks", "KV blocks copied to the swap space at preemption.", swap.swapped_out_blocks),
        ("kv_swapped_in_blocks", "KV blocks copied back from the swap space at resumption.", swap.swapped_in_blocks),
        ("kv_swap_preemptions", "Preemptions whose blocks went to the swap space (the rest of num_preemptions "
                                "recomputed).", swap.num_swapped),
    ), labels, prefix)


def _disk_cache_metrics(disk: DiskCacheStats, labels: list[str], prefix: str) -> Iterator:
    """The disk prefix tier (--kv-disk-cache-dir); external_prefix_cache_* are vLLM's names for a prefix cache
    outside the pool (its KV connectors')."""
    yield from _families((
        ("kv_disk_cache_bytes", "Bytes of KV block files in the disk prefix cache's folder (every model's).",
         disk.held_bytes),
    ), (
        ("external_prefix_cache_queries", "Prompt tokens looked up in the disk prefix cache after a prefix-cache miss.",
         disk.queried_tokens),
        ("external_prefix_cache_hits", "Prompt tokens read back from the disk prefix cache.", disk.hit_tokens),
        ("kv_disk_cache_written_blocks", "KV blocks written to the disk prefix cache.", disk.written_blocks),
        ("kv_disk_cache_dropped_blocks", "KV blocks not written: the write queue was full.", disk.dropped_writes),
        ("kv_disk_cache_damaged_files", "Disk prefix cache files that failed their check when read (a miss).",
         disk.damaged_files),
    ), labels, prefix)


class Renamed:
    """A metric's series under a second name as well (a deprecated name a dashboard still queries)."""

    def __init__(self, metric: Histogram, name: str) -> None:
        self.metric, self.name = metric, name

    def collect(self) -> Iterator[Metric]:
        for family in self.metric.collect():
            renamed = Metric(self.name, "DEPRECATED name of " + family.name, family.type)
            renamed.samples = [x._replace(name=self.name + x.name[len(family.name):]) for x in family.samples]
            yield renamed


def _speculation_metrics(spec: SpeculationStats, labels: list[str], prefix: str) -> Iterator:
    """vLLM's spec_decode metrics; only when speculative decoding is configured, as in vLLM."""
    yield from _families((), (
        (SPEC_DECODE_NUM_DRAFTS, "Requests that verified proposals, summed over steps.", spec.num_drafts),
        (SPEC_DECODE_NUM_DRAFT_TOKENS, "Proposed tokens verified.", spec.num_draft_tokens),
        (SPEC_DECODE_NUM_ACCEPTED_TOKENS, "Proposed tokens accepted.", spec.num_accepted_tokens),
    ), labels, prefix)
    c = CounterMetricFamily(prefix + SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS,
                            "Proposed tokens accepted, by position in the proposal (0 = first).",
                            labels=["model_name", "position"])
    for position, value in enumerate(spec.accepted_per_position):
        c.add_metric([*labels, str(position)], value)
    yield c
    g = GaugeMetricFamily(prefix + "spec_decode_num_speculative_tokens",
                          "Mean proposals verified per speculating request, the last step that had any "
                          "(chosen per step by the adaptive policy).", labels=["model_name"])
    g.add_metric(labels, spec.last_num_speculative_tokens)
    yield g


def _policy_metrics(counted: Counters, labels: list[str], prefix: str) -> Iterator:
    """The adaptive policy's counts (tally/engine/speculation/policy.py): what its measuring lost, per step counted,
    is what a server pays for it; with "adaptive": false there is no policy and none is served."""
    yield from _families((), (
        (SPEC_DECODE_POLICY_STEPS, "Steps without a prompt chunk the adaptive policy counted.", counted.steps),
        (SPEC_DECODE_POLICY_MEASURING_STEPS, "Steps of its epochs measuring a proposal's price.", counted.measuring),
        (SPEC_DECODE_POLICY_SPECULATING_STEPS, "Steps that verified proposals.", counted.speculated),
        (SPEC_DECODE_POLICY_LOST_OFF_STEPS, "What measuring (and following prices that failed) lost against "
         "speculation off, in steps with it off.", counted.lost_off_steps),
    ), labels, prefix)


class ServerMetrics:
    def __init__(self, model_name: str, snapshot: Callable[[], EngineSnapshot], prefix: str = PREFIX,
                 cache_config: dict[str, str] | None = None) -> None:
        """cache_config: the labels of cache_config_info besides the block size and count (`cache_config_info`)."""
        self.model_name = model_name
        disable_created_metrics()  # no *_created series: vLLM serves none, and dashboards never read them
        self.registry = r = CollectorRegistry()
        ProcessCollector(registry=r)
        r.register(EngineCollector(model_name, snapshot, prefix, cache_config))
        req = ["model_name", "endpoint"]

        def hist(name: str, doc: str, buckets: tuple = TIME_BUCKETS_S) -> Histogram:
            return Histogram(prefix + name, doc, req, buckets=buckets, registry=r)

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(prefix + name, doc, req + list(extra), registry=r)

        self.ttft = hist(TIME_TO_FIRST_TOKEN_SECONDS, "Arrival at the server to first token sent.")
        self.itl = hist(INTER_TOKEN_LATENCY_SECONDS, "Gap between two consecutive streamed tokens.")
        self.tpot = hist(REQUEST_TIME_PER_OUTPUT_TOKEN_SECONDS, "(last - first token) / (tokens - 1).")
        self.e2e = hist(E2E_REQUEST_LATENCY_SECONDS, "Arrival at the server to last token.")
        self.queue = hist(REQUEST_QUEUE_TIME_SECONDS, "Arrival to first scheduled.")
        self.prefill = hist("request_prefill_time_seconds", "First scheduled to first token.")
        self.decode = hist("request_decode_time_seconds", "First token to last token.")
        self.inference = hist("request_inference_time_seconds", "First scheduled to last token (prefill + decode).",
                              REQUEST_TIME_BUCKETS_S)
        self.n = hist("request_params_n", "The n request parameter.", N_BUCKETS)
        self.max_tokens = hist("request_params_max_tokens", "The max_tokens request parameter (when unset: "
                               "the generation config's max_new_tokens, at most max_model_len - prompt tokens, as "
                               "the engine resolves it).", TOKEN_BUCKETS)
        self.max_generation_tokens = hist("request_max_num_generation_tokens",
                                          "Generated tokens of a request's longest sample (n > 1).", TOKEN_BUCKETS)
        self.prompt_tokens = hist("request_prompt_tokens", "Prompt tokens per request.", TOKEN_BUCKETS)
        self.generation_tokens = hist(REQUEST_GENERATION_TOKENS, "Generated tokens per request.", TOKEN_BUCKETS)
        self.prompt_tokens_total = counter("prompt_tokens", "Prompt tokens processed.")
        self.generation_tokens_total = counter("generation_tokens", "Tokens generated.")
        self.success = counter(REQUEST_SUCCESS, "Requests finished, by finish reason.", ("finished_reason",))
        self.rejected = counter(REQUEST_REJECTED, "Requests turned away by admission control.", ("reason",))
        self.timeouts = counter(REQUEST_TIMEOUT, "Requests that ran past --request-timeout.")
        self.errors = counter(REQUEST_ERROR, "Requests that failed, by HTTP status.", ("code",))
        if prefix == METRICS_PREFIXES["vllm"]:
            r.register(Renamed(self.itl, prefix + TIME_PER_OUTPUT_TOKEN_SECONDS))
        # Rejections, timeouts and server errors start at 0, not at their first occurrence: Prometheus' rate()
        # and increase() cannot see a counter's step from nothing to its first value, so an alert on a burst of
        # 429s in one scrape interval would never fire (tests/test_ops_prometheus.py).
        for endpoint in ENDPOINTS:
            for reason in REJECTION_REASONS:
                self.rejected.labels(model_name, endpoint, reason)
            self.timeouts.labels(model_name, endpoint)
            for code in ("500", "503", "504"):
                self.errors.labels(model_name, endpoint, code)

    def observe_itl(self, endpoint: str, gap_s: float | None, num_tokens: int) -> None:
        """A chunk carrying num_tokens new tokens: the first waited gap_s (None: the stream's first chunk, whose
        first token is TTFT's), the rest came with it."""
        h = self.itl.labels(self.model_name, endpoint)
        if gap_s is not None:
            h.observe(gap_s)
        for _ in range(num_tokens - 1):
            h.observe(0.0)

    def observe_output(self, endpoint: str, out: RequestOutput, times: StreamTimes | None, max_tokens: int) -> None:
        """One finished engine request (one prompt, n samples) that was allowed `max_tokens` per sample. Streaming
        requests pass the times their tokens were sent; otherwise the engine's token times stand in (the body goes
        at the end)."""
        labels = (self.model_name, endpoint)
        m = out.metrics
        n_prompt = len(out.prompt_token_ids)
        n_gen = sum(len(c.token_ids) for c in out.outputs)
        longest = max((len(c.token_ids) for c in out.outputs), default=0)
        self.prompt_tokens.labels(*labels).observe(n_prompt)
        self.generation_tokens.labels(*labels).observe(n_gen)
        self.prompt_tokens_total.labels(*labels).inc(n_prompt)
        self.generation_tokens_total.labels(*labels).inc(n_gen)
        self.n.labels(*labels).observe(len(out.outputs))
        self.max_tokens.labels(*labels).observe(max_tokens)
        self.max_generation_tokens.labels(*labels).observe(longest)
        if m is None:
            return
        first = times.first_token_sent_s if times and times.first_token_sent_s else m.first_token_time
        last = times.last_token_sent_s if times and times.last_token_sent_s else m.last_token_time
        if m.first_scheduled_time is not None:
            self.queue.labels(*labels).observe(m.first_scheduled_time - m.arrival_time)
            if m.first_token_time is not None:
                self.prefill.labels(*labels).observe(m.first_token_time - m.first_scheduled_time)
                self.inference.labels(*labels).observe(m.last_token_time - m.first_scheduled_time)
        if first is None or last is None:
            return
        self.ttft.labels(*labels).observe(first - m.arrival_time)
        self.e2e.labels(*labels).observe(last - m.arrival_time)
        self.decode.labels(*labels).observe(last - first)
        if longest > 1:
            self.tpot.labels(*labels).observe((last - first) / (longest - 1))

    def count_success(self, endpoint: str, finished_reason: str) -> None:
        self.success.labels(self.model_name, endpoint, finished_reason).inc()

    def count_rejected(self, endpoint: str, reason: str) -> None:
        self.rejected.labels(self.model_name, endpoint, reason).inc()

    def count_timeout(self, endpoint: str) -> None:
        self.timeouts.labels(self.model_name, endpoint).inc()

    def count_error(self, endpoint: str, http_status: int) -> None:
        self.errors.labels(self.model_name, endpoint, str(http_status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
