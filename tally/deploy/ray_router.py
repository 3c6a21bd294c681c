"""Prefix-cache affinity for Ray Serve's request router: requests whose prompts share their leading text (a long
system prompt) go to one replica, whose prefix cache already holds that text's KV blocks.

The replica is chosen by rendezvous hashing of the prefix with each replica's id: every router (each ingress
replica has one) picks the same replica without shared state, and when replicas come or go only the prefixes of
those replicas move. Affinity yields to load: when the chosen replica's queue is imbalanced_threshold requests
longer than another's, or full (Ray's max_ongoing_requests), the request goes to the shorter of two random
queues, Ray's own power-of-two-choices rule. Requests without a prefix (short prompts, other routes) take that
rule directly. Ray's PrefixCacheAffinityRouter (ray.serve.llm) keeps a prefix tree in an actor instead; it needs
Ray's LLM extra and every routing decision waits on that actor."""
from __future__ import annotations

import hashlib
import random

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from tally.deploy.ray_forward import ForwardedRequest


class PrefixAffinityRouter(RequestRouter):
    def initialize_state(self, imbalanced_threshold: int = 8) -> None:
        self.imbalanced_threshold = imbalanced_threshold

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        """Ranks of replicas, the preferred first: Ray sends the request to the shortest queue of the first rank
        that has room, then tries the next rank."""
        prefix = _prompt_prefix(pending_request)
        two = random.sample(candidate_replicas, min(2, len(candidate_replicas)))
        if prefix is None or len(candidate_replicas) < 2:
            return [two]
        ranked = sorted(candidate_replicas, key=lambda r: _weight(prefix, r.replica_id.unique_id), reverse=True)
        home = ranked[0]
        known = {r.replica_id: n for r in ranked if (n := self.replica_queue_len_cache.get(r.replica_id)) is not None}
        if home.replica_id in known and known[home.replica_id] - min(known.values()) > self.imbalanced_threshold:
            return [two]
        return [[home], two]


def _prompt_prefix(pending_request: PendingRequest | None) -> str | None:
    args = pending_request.args if pending_request is not None else ()
    return args[0].prompt_prefix if args and isinstance(args[0], ForwardedRequest) else None


def _weight(prefix: str, replica: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{replica}\0{prefix}".encode(), digest_size=8).digest(), "big")
