"""The pod of the `tally route` router (tally deploy k8s --canary or --plan): its command line — the stable pods'
Service as its replica and the canary's as its canary, with the rules file mounted from a ConfigMap; or each length
pool's Service as a pool — and probes that never restart it for what its replicas do."""
from __future__ import annotations

import hashlib

from tally.deploy.k8s_config import CANARY, STABLE, K8sConfig
from tally.deploy.k8s_pools import LONG, MAIN
from tally.deploy.k8s_pod import (
    PORT,
    PORT_NAME,
    PRE_STOP_S,
    container_security,
    pod_security,
    pre_stop,
    probe,
    selector_labels,
)

ROUTE_PORT = 8080  # tally route's default
RULES_DIR = "/etc/tally-route"  # the ConfigMap, mounted read-only
RULES_FILE = "rules.yaml"
AUDIT_LOG = "/dev/stdout"  # every decision one JSON line in the pod's log, which the cluster keeps past a restart
# A proxy that passes bytes on and judges a window every few seconds: a quarter of a CPU requested, none limited,
# since throttling it would add its pauses to every stream. Memory: the process holds 59 MB idle with a canary
# running (Python, starlette, httpx, numpy); each request in flight adds its buffers, each in the window a sample.
RESOURCES = {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}}


def service_url(config: K8sConfig, part: str) -> str:
    """A part's Service, by its name: the router runs in the same namespace."""
    return f"http://{config.name}-{part}:{PORT}"


def route_args(config: K8sConfig) -> list[str]:
    """`tally route` flags for `config`'s length pools, or its canary: the router judges the canary's Service
    against the stable's."""
    args = ["--host", "0.0.0.0", "--port", str(ROUTE_PORT)]
    if config.pools is not None:
        return args + ["--pool", f"{MAIN}={service_url(config, MAIN)}", "--pool", f"{LONG}={service_url(config, LONG)}",
                       "--long-pool", LONG, "--long-threshold", str(config.pools.threshold_tokens)]
    rollout = config.canary
    args += ["--replica", service_url(config, STABLE), "--canary", service_url(config, CANARY),
            "--plan", rollout.plan, "--rules", f"{RULES_DIR}/{RULES_FILE}", "--audit-log", AUDIT_LOG]
    if rollout.eval_interval is not None:
        args += ["--eval-interval", rollout.eval_interval]
    if rollout.sticky_header is not None:
        args += ["--sticky-header", rollout.sticky_header]
    return args


def router_pod_template(config: K8sConfig, route: K8sConfig) -> dict:
    """`config`: the whole deployment; `route`: its router part (names and labels)."""
    container = {
        "name": "route",
        "image": config.image,  # the image holds tally route (its `ops` extra) beside tally serve
        "imagePullPolicy": "IfNotPresent",
        "command": ["tally", "route"],
        "args": route_args(config),
        "ports": [{"name": PORT_NAME, "containerPort": ROUTE_PORT, "protocol": "TCP"}],
        "resources": {kind: dict(values) for kind, values in RESOURCES.items()},
        # /health says 503 while neither side has a healthy pod: take the router out of the Service then, but never
        # restart it for that (all pods loading their model), since a restart starts the canary's plan over.
        # /router/status answers whenever the process does.
        "readinessProbe": probe("/health", 5, 3, 2),
        "livenessProbe": probe("/router/status", 10, 5, 3),
        "lifecycle": pre_stop(),
        "securityContext": container_security(),
    }
    # streams through the router last as long as the servers' own
    spec = {"containers": [container], "securityContext": pod_security(),
            "terminationGracePeriodSeconds": PRE_STOP_S + config.drain_timeout_s + 10}
    if config.canary is None:
        return {"metadata": {"labels": selector_labels(route)}, "spec": spec}
    container["volumeMounts"] = [{"name": "rules", "mountPath": RULES_DIR, "readOnly": True}]
    spec["volumes"] = [{"name": "rules", "configMap": {"name": route.name}}]
    rules_sha256 = hashlib.sha256(config.canary.rules_yaml.encode()).hexdigest()
    # the router reads its rules once, at start: a changed file rolls the pod
    return {"metadata": {"labels": selector_labels(route), "annotations": {"tally/rules-sha256": rules_sha256}},
            "spec": spec}
