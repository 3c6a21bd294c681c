"""Ray Serve's custom autoscaling policy for engine replicas: how many replicas the engines' own load needs,
read from what each replica reports (tally/deploy/ray_server.py:LLMServer.record_autoscaling_stats), rather than
Ray's default count of requests in flight, which cannot tell a replica decoding 30 short answers with room to
spare from one whose KV blocks are exhausted.

A replica's usage is the fuller of its two resources, KV blocks and batch slots; each request waiting for them,
in the engine or at Ray's handles, counts as one batch slot more. The replicas needed are the total over
target_usage. Ray bounds the answer by min/max replicas and holds it through upscale_delay_s / downscale_delay_s.
Ray pickles this module by value into its controller: it imports nothing of Tally's."""
from __future__ import annotations

from typing import Any

from ray.serve.config import AutoscalingContext


class EngineLoadPolicy:
    def __init__(self, target_usage: float = 0.8) -> None:
        self.target_usage = target_usage

    def __call__(self, ctx: AutoscalingContext) -> tuple[float, dict[str, Any]]:
        metrics = ctx.aggregated_metrics or {}
        slots = metrics.get("max_num_seqs", {})
        if not slots:  # no replica has reported yet: keep what there is
            return ctx.target_num_replicas, {}
        kv, running = metrics.get("kv_cache_usage_perc", {}), metrics.get("num_requests_running", {})
        waiting = metrics.get("num_requests_waiting", {})
        work = sum(max(kv.get(r, 0.0), running.get(r, 0.0) / n) + waiting.get(r, 0.0) / n for r, n in slots.items())
        work += (ctx.total_queued_requests or 0.0) / (sum(slots.values()) / len(slots))
        return work / self.target_usage, {}
