"""One engine replica of the Ray Serve application (ray.llm calls its counterpart LLMServer): the same engine and
OpenAI app a single `tally serve` runs (tally/server/app_args.py:app_from_args), serving the requests the ingress
forwards, reporting its engine's load to Ray's autoscaler and its Prometheus series to the ingress's /metrics."""
from __future__ import annotations

import argparse
from collections.abc import AsyncIterator

from prometheus_client import Metric
from ray import serve
from starlette.types import Message

from tally.deploy.ray_forward import ForwardedRequest, run_asgi
from tally.errors import EngineDeadError
from tally.server.app_args import app_from_args

REPLICA_HEADER = b"tally-replica"  # which replica answered: its full id, also its actor's name


class LLMServer:
    async def __init__(self, ns: argparse.Namespace) -> None:
        replica = serve.get_replica_context().replica_id
        self.replica_id = replica.to_full_id_str()
        self.replica_label = replica.unique_id
        if ns.request_log is not None:  # replicas appending to one file would interleave their lines
            ns = argparse.Namespace(**{**vars(ns), "request_log": ns.request_log / replica.unique_id})
        self.app = app_from_args(ns)
        self.state = self.app.state.tally
        self.max_num_seqs = ns.max_num_seqs
        self._lifespan = self.app.router.lifespan_context(self.app)
        await self._lifespan.__aenter__()  # starts the engine loop, on the loop that serves requests

    async def serve_http(self, request: ForwardedRequest) -> AsyncIterator[Message]:
        async for message in run_asgi(self.app, request):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()),
                                                  (REPLICA_HEADER, self.replica_id.encode())]}
            yield message

    async def check_health(self) -> None:
        """Ray replaces a replica whose check keeps failing: here, one whose engine loop died."""
        if not self.state.engine.is_alive:
            raise EngineDeadError("the engine loop is not running; see this replica's log")

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """What tally/deploy/ray_autoscaling.py:EngineLoadPolicy reads of each replica, with vLLM's metric names."""
        snapshot = self.state.engine.snapshot
        return {"num_requests_waiting": self.state.engine.queue_depth(), "num_requests_running": snapshot.num_running,
                "kv_cache_usage_perc": snapshot.kv_usage, "max_num_seqs": self.max_num_seqs}

    async def metric_families(self) -> list[Metric]:
        """This replica's /metrics series, each labelled replica=<its id>, for the ingress to merge."""
        families = list(self.state.metrics.registry.collect())
        for family in families:
            family.samples = [s._replace(labels={**s.labels, "replica": self.replica_label}) for s in family.samples]
        return families

    async def __del__(self) -> None:
        await self._lifespan.__aexit__(None, None, None)  # stops the engine loop
