"""`tally serve --ray`: how many engine replicas Ray Serve runs and how it scales, routes and retries them.

The flags join tally serve's own parser (every engine and server flag keeps its meaning in each replica); the
settings without a flag (delays, targets) are RayServeOptions fields, which `serve run`'s application builder
takes by name (tally/deploy/ray_app.py). No Ray import here: a plain `tally serve` never loads Ray, and the
server parses these flags without importing tally.deploy (`tally serve --ray` starts in tally/deploy/serve_cli.py)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

from tally.errors import ConfigError
from tally.flags import REPLICAS


@dataclass(frozen=True)
class RayServeOptions:
    num_replicas: int = 1  # fixed replica count, unless min/max_replicas are set
    min_replicas: int | None = None  # --autoscale MIN:MAX
    max_replicas: int | None = None
    cpus_per_replica: int = 1  # Ray reserves these per replica and its engine uses as many threads (--threads)
    # Ray's AutoscalingConfig names and defaults; the load each replica reports is the engine's, not request counts
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    look_back_period_s: float = 30.0
    target_usage: float = 0.8  # share of a replica's batch slots / KV blocks the autoscaler aims at
    # Requests whose prompt text shares its first affinity_chars characters go to one replica (its prefix cache);
    # shorter prompts have no prefix worth keeping and go to the least loaded replica.
    affinity_chars: int = 1000
    imbalanced_threshold: int = 8  # affinity yields when its replica holds this many more requests than the least
    max_attempts: int = 3  # tries of a request whose replica died before it sent a byte

    def __post_init__(self) -> None:
        if (self.min_replicas is None) != (self.max_replicas is None):
            raise ConfigError("autoscaling needs both min_replicas and max_replicas")
        if self.autoscaling:
            if self.min_replicas < 0 or self.max_replicas < 1:
                raise ConfigError(f"--autoscale {self.min_replicas}:{self.max_replicas}: MIN must be ≥ 0 and "
                                  f"MAX ≥ 1")
            if self.min_replicas > self.max_replicas:
                raise ConfigError(f"--autoscale {self.min_replicas}:{self.max_replicas}: MIN is above MAX; write "
                                  f"the smaller number first, e.g. --autoscale {self.max_replicas}:"
                                  f"{self.min_replicas}")
        elif self.num_replicas < 1:
            raise ConfigError(f"--replicas must be ≥ 1, got {self.num_replicas}; for replicas that come and go "
                              f"with load use --autoscale MIN:MAX")
        if self.cpus_per_replica < 1 or not 0 < self.target_usage <= 1 or self.max_attempts < 1:
            raise ConfigError("cpus_per_replica and max_attempts must be ≥ 1 and target_usage in (0, 1]")
        if min(self.upscale_delay_s, self.downscale_delay_s) < 0 or self.look_back_period_s <= 0:
            raise ConfigError("upscale_delay_s and downscale_delay_s must be ≥ 0 s, look_back_period_s > 0 s")
        if self.affinity_chars < 1 or self.imbalanced_threshold < 0:
            raise ConfigError("affinity_chars must be ≥ 1 and imbalanced_threshold ≥ 0")

    @property
    def autoscaling(self) -> bool:
        return self.max_replicas is not None

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls)}


def add_ray_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Ray Serve (docs/deploy.md)")
    g.add_argument("--ray", action="store_true",
                   help="serve through Ray Serve: engine replicas behind Ray's HTTP proxy on --host/--port, on the "
                        "cluster at $RAY_ADDRESS or a local one; each replica reserves --threads CPUs (default 1)")
    REPLICAS.add(g, note=" through Ray Serve (default 1)")
    g.add_argument("--autoscale", type=_min_max, default=None, metavar="MIN:MAX",
                   help="between MIN and MAX replicas, by the engines' queue depth and KV usage")


def check_ray_args(p: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    """Refuses Ray flags that cannot work together, with what to write instead."""
    if not ns.ray and (ns.replicas is not None or ns.autoscale is not None):
        p.error("--replicas and --autoscale need --ray (one `tally serve` process is one replica)")
    if not ns.ray:
        return
    if ns.replicas is not None and ns.autoscale is not None:
        p.error("give --replicas N (a fixed count) or --autoscale MIN:MAX (a range), not both")
    if ns.cpu_affinity is not None:
        p.error("--cpu-affinity would pin every replica on a node to the same CPUs; under --ray, Ray places the "
                "replicas and each reserves --threads CPUs")
    if ns.header_timeout != p.get_default("header_timeout"):
        p.error("--header-timeout cannot apply under --ray: Ray's HTTP proxy accepts the connections, and it takes "
                "no deadline for a request's headers; leave the flag out, and set such a deadline on the load "
                "balancer in front of Ray's proxies")
    if ns.tensor_parallel_size != 1 or ns.pipeline_parallel_size != 1:
        p.error("--tensor-parallel-size and --pipeline-parallel-size start processes Ray does not place; under --ray "
                "scale out with --replicas or --autoscale, each replica one process")
    try:
        ray_options(ns)
    except ConfigError as exc:
        p.error(exc.message)


def ray_options(ns: argparse.Namespace) -> RayServeOptions:
    low, high = ns.autoscale or (None, None)
    return RayServeOptions(num_replicas=1 if ns.replicas is None else ns.replicas, min_replicas=low,
                           max_replicas=high, cpus_per_replica=ns.threads or 1)


def _min_max(text: str) -> tuple[int, int]:
    low, sep, high = text.partition(":")
    if not sep or not low.strip().isdigit() or not high.strip().isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: write MIN:MAX replicas, e.g. 1:4")
    return int(low), int(high)
