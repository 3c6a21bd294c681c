"""The pod `tally deploy k8s` runs: the server's command line, resources from the ledger, probes, and shutdown."""
from __future__ import annotations

import math

from tally.deploy.k8s_config import K8sConfig
from tally.deploy.k8s_sizing import MODEL_MOUNT, PodSizing
from tally.errors import ConfigError

PORT = 8000  # tally serve's default; the Dockerfile's EXPOSE and HEALTHCHECK use it too
PORT_NAME = "http"
RUN_AS_USER = 10001  # the Dockerfile's user: numeric, so runAsNonRoot can check it
PRE_STOP_S = 5  # endpoints controllers and kube-proxies drop the pod before SIGTERM turns requests away
STARTUP_PERIOD_S = 10


def selector_labels(config: K8sConfig) -> dict[str, str]:
    return {"app.kubernetes.io/name": "tally", "app.kubernetes.io/instance": config.name}


def server_args(config: K8sConfig, sizing: PodSizing) -> list[str]:
    """`tally serve` flags; they replace the image's CMD, so --host 0.0.0.0 is repeated here. The dtype, length
    and KV pool are pinned to what the memory request was sized for: left to itself, the engine measures its
    dtype and sizes its pool from the node's free RAM, neither of which the request can know."""
    shape = ["--host", "0.0.0.0", "--port", str(PORT), "--model", sizing.model_arg,
             "--max-model-len", str(sizing.max_model_len), "--dtype", sizing.dtype,
             "--kv-cache-memory", str(sizing.kv_pool_bytes), "--swap-space", repr(sizing.swap_space_gib),
             # a container sees the node's cores; its threads should match the CPUs it may use
             "--threads", str(config.cpus),
             "--metrics-prefix", config.metrics_prefix, "--drain-timeout", str(config.drain_timeout_s)]
    tuning = []  # what fills the pool, not its size: a canary may change these
    if config.kv_cache_dtype != "auto":
        tuning += ["--kv-cache-dtype", config.kv_cache_dtype]
    if config.max_num_seqs is not None:
        tuning += ["--max-num-seqs", str(config.max_num_seqs)]
    return shape + tuning + _canary_flags(config.serve_flags, shape)


def _canary_flags(extra: tuple[str, ...], shape: list[str]) -> list[str]:
    """`extra` (the canary's flags, last, so they win), refused where it would set a flag of the pod's shape: the
    memory and CPUs it was sized for, its port, the metrics its autoscaler reads, the drain its grace period
    allows. argparse reads a unique prefix of a flag as the flag, so a prefix counts."""
    for token in extra:
        flag = token.partition("=")[0]
        taken = next((w for w in shape if w.startswith(flag)), None) if flag.startswith("--") and flag != "--" \
            else None
        if taken is not None:
            raise ConfigError(f"--canary cannot set {taken}: every pod runs with {taken} "
                              f"{shape[shape.index(taken) + 1]}, which its memory request, CPUs, probes or "
                              "autoscaler were written for; change it for both with tally deploy's own option")
    return list(extra)


def pre_stop() -> dict:
    return {"preStop": {"exec": {"command": ["sleep", str(PRE_STOP_S)]}}}


def pod_security() -> dict:
    return {"runAsNonRoot": True, "runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"}}


def container_security() -> dict:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def probe(path: str, period_s: int, timeout_s: int, failures: int) -> dict:
    return {"httpGet": {"path": path, "port": PORT_NAME}, "periodSeconds": period_s, "timeoutSeconds": timeout_s,
            "failureThreshold": failures}


def container(config: K8sConfig, sizing: PodSizing) -> dict:
    # requests = limits for CPU and memory: the Guaranteed class, never the first evicted, and whole CPUs a static
    # CPU manager can pin; the memory is the ledger's figure, exact to the byte (a Kubernetes quantity).
    resources = {"cpu": str(config.cpus), "memory": str(sizing.memory_bytes)}
    out = {
        "name": "tally",
        "image": config.image,
        "imagePullPolicy": "IfNotPresent",
        "args": server_args(config, sizing),
        "ports": [{"name": PORT_NAME, "containerPort": PORT, "protocol": "TCP"}],
        "resources": {"requests": resources, "limits": dict(resources)},
        # Loading a large model from a volume may take minutes; the startup probe allows it once, so liveness
        # needs no initial delay.
        "startupProbe": probe("/health", STARTUP_PERIOD_S, 5, math.ceil(config.startup_timeout_s / STARTUP_PERIOD_S)),
        "readinessProbe": probe("/health", 5, 5, 3),
        # /health is answered on the HTTP loop while the engine thread computes, but a long prefill on CPUs held
        # at their limit can delay the answer by seconds, and a restart drops every stream and reloads the model:
        # liveness acts only after two minutes without an answer (or of 503, which /health says once the engine
        # loop is dead).
        "livenessProbe": probe("/health", 30, 10, 4),
        "lifecycle": pre_stop(),
        "securityContext": container_security(),
    }
    if config.api_key_secret is not None:
        out["env"] = [{"name": "TALLY_API_KEY",
                       "valueFrom": {"secretKeyRef": {"name": config.api_key_secret, "key": "api-key"}}}]
    if config.model_pvc is not None:
        out["volumeMounts"] = [{"name": "models", "mountPath": MODEL_MOUNT, "readOnly": True}]
    return out


def pod_template(config: K8sConfig, sizing: PodSizing) -> dict:
    spec = {
        "containers": [container(config, sizing)],
        # The root filesystem stays writable: on a CPU unlike the build machine's the server builds its native
        # kernels into ~/.cache/tally, where the image's own are (an emptyDir there would hide those).
        "securityContext": pod_security(),
        "terminationGracePeriodSeconds": PRE_STOP_S + config.drain_timeout_s + 10,
    }
    if config.model_pvc is not None:
        spec["volumes"] = [{"name": "models",
                            "persistentVolumeClaim": {"claimName": config.model_pvc, "readOnly": True}}]
    return {"metadata": {"labels": selector_labels(config)}, "spec": spec}
