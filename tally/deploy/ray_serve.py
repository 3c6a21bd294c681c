"""The Ray Serve application of a `tally serve` command line — OpenAiIngress in front of LLMServer replicas, with
Tally's router and autoscaling policy — and `tally serve --ray`, which runs it until SIGINT / SIGTERM."""
from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

import ray
from ray import serve
from ray.serve import Application
from ray.serve.config import AutoscalingConfig, AutoscalingPolicy, RequestRouterConfig

from tally.deploy.ray_autoscaling import EngineLoadPolicy
from tally.deploy.ray_ingress import OpenAiIngress
from tally.deploy.ray_router import PrefixAffinityRouter
from tally.deploy.ray_server import LLMServer
from tally.engine.args import config_from_args
from tally.errors import TallyError
from tally.server.app_args import allowed_hosts
from tally.server.ray_flags import RayServeOptions, ray_options

log = logging.getLogger("tally.deploy")
APP_NAME = "tally"


def application(ns: argparse.Namespace, options: RayServeOptions) -> Application:
    """`ns`: tally serve's parsed flags, which every replica's engine and app are built from."""
    replica_ns = argparse.Namespace(**{**vars(ns), "threads": options.cpus_per_replica})
    config_from_args(replica_ns)  # a bad engine option is refused here, not once per replica
    if options.autoscaling:
        scaling = {"autoscaling_config": AutoscalingConfig(
            min_replicas=options.min_replicas, max_replicas=options.max_replicas,
            upscale_delay_s=options.upscale_delay_s, downscale_delay_s=options.downscale_delay_s,
            look_back_period_s=options.look_back_period_s,
            policy=AutoscalingPolicy(policy_function=EngineLoadPolicy,
                                     policy_kwargs={"target_usage": options.target_usage}))}
    else:
        scaling = {"num_replicas": options.num_replicas}
    server = serve.deployment(LLMServer).options(
        ray_actor_options={"num_cpus": options.cpus_per_replica},
        # a batch running and as many waiting; beyond that requests wait at Ray's handle, where any replica that
        # frees (or a new one) can take them
        max_ongoing_requests=2 * ns.max_num_seqs,
        graceful_shutdown_timeout_s=ns.drain_timeout,
        request_router_config=RequestRouterConfig(
            request_router_class=PrefixAffinityRouter,
            request_router_kwargs={"imbalanced_threshold": options.imbalanced_threshold}),
        **scaling)
    # The ingress only moves bytes: no CPU reserved, so replicas get the cluster's CPUs.
    ingress = serve.deployment(OpenAiIngress).options(ray_actor_options={"num_cpus": 0},
                                                      max_ongoing_requests=ns.max_connections)
    return ingress.bind(server.bind(replica_ns), ns.max_body_bytes, allowed_hosts(ns.allowed_hosts, ns.host),
                        options.affinity_chars, options.max_attempts)


def serve_on_ray(ns: argparse.Namespace) -> int:
    options = ray_options(ns)
    try:
        app = application(ns, options)
    except TallyError as exc:
        print(f"tally serve: {exc.message}", file=sys.stderr)
        return 2
    ray.init()  # the cluster at $RAY_ADDRESS, else a local one
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops as Ctrl-C does (Ray set its own)
    try:
        serve.start(http_options={"host": ns.host, "port": ns.port})
        serve.run(app, name=APP_NAME, route_prefix="/")
        replicas = (f"{options.min_replicas}-{options.max_replicas} (autoscaling)" if options.autoscaling
                    else options.num_replicas)
        log.info("serving on http://%s:%d with %s replicas through Ray Serve; Ctrl-C stops", ns.host, ns.port,
                 replicas)
        threading.Event().wait()
    except KeyboardInterrupt:
        serve.delete(APP_NAME)  # replicas drain for --drain-timeout; other apps on the cluster keep running
    except RuntimeError as exc:  # replicas failed to start: Ray's status keeps the error they raised
        print(f"tally serve --ray: the application did not start: {exc}\n{_startup_error()}", file=sys.stderr)
        serve.delete(APP_NAME)
        return 2
    finally:
        ray.shutdown()
    return 0


def _startup_error() -> str:
    """The last line of the traceback of the replica that failed to start (a TallyError says what to fix)."""
    status = serve.status().applications.get(APP_NAME)
    lines = [line for d in (status.deployments.values() if status else ()) for line in d.message.splitlines()
             if line.strip()]
    return lines[-1] if lines else ""
