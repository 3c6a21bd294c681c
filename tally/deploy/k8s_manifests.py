"""The objects `tally deploy k8s` writes: Deployment, Service, HorizontalPodAutoscaler on the waiting queue,
PodMonitor for the Prometheus Operator, and the Prometheus adapter rule that turns the scraped series into the
autoscaler's metric. With a canary, the same four for the canary's pods, and the `tally route` router in front of
both (tally/deploy/k8s_router.py), whose Service takes the name clients already use; with length pools, the four
for each pool and the router in front of the two."""
from __future__ import annotations

from tally.deploy.k8s_config import CANARY, METRICS_PREFIXES, ROUTE, STABLE, K8sConfig
from tally.deploy.k8s_pod import PORT, PORT_NAME, pod_template, selector_labels
from tally.deploy.k8s_router import RULES_FILE, router_pod_template
from tally.deploy.k8s_sizing import PodSizing
from tally.version import __version__

WAITING = "num_requests_waiting"  # tally/server/metrics.py's gauge (vLLM's name), under the --metrics-prefix


def waiting_series(config: K8sConfig) -> str:
    """The series Prometheus scrapes: tally:num_requests_waiting."""
    return METRICS_PREFIXES[config.metrics_prefix] + WAITING


def hpa_metric(config: K8sConfig) -> str:
    """The custom metric the autoscaler asks for: tally_num_requests_waiting. The adapter renames the colon away,
    as vLLM's production stack does for vllm:num_requests_waiting (observability/prom-adapter.yaml)."""
    return f"{config.metrics_prefix}_{WAITING}"


def pool_parts(config: K8sConfig) -> dict[str, K8sConfig]:
    """Each length pool's part: its pods at its own max_model_len, as many as the plan's share of slots asks."""
    pools = config.pools
    return {pool: config.part(pool, max_model_len=length, replicas=pools.replicas(pool, config.replicas),
                              max_replicas=pools.replicas(pool, config.hpa_max_replicas))
            for pool, length in pools.max_model_lens.items()}


def pool_manifests(config: K8sConfig, sizings: dict[str, PodSizing]) -> list[dict]:
    """Both pools, each its Service, and the router in front of them under the name clients use."""
    route = config.part(ROUTE)
    docs = [_service(route, config.name)]
    for pool, part in pool_parts(config).items():
        docs += [_service(part), *_pods(part, sizings[pool])]
    return docs + [_router_deployment(config, route), _pod_monitor(route)]


def manifests(config: K8sConfig, sizing: PodSizing) -> list[dict]:
    if config.canary is None:
        return [_service(config), *_pods(config, sizing)]
    rollout = config.canary
    canary = config.part(CANARY, image=rollout.image or config.image, replicas=rollout.replicas,
                         max_replicas=config.hpa_max_replicas, serve_flags=rollout.serve_flags)
    route = config.part(ROUTE)
    return [
        # first, so `kubectl apply -f -` has it before the router's pod mounts it
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _metadata(route),
         "data": {RULES_FILE: rollout.rules_yaml}},
        # the entry point keeps the name clients use without a canary; the stable pods' Service moves aside
        _service(route, config.name), _service(config, f"{config.name}-{STABLE}"), *_pods(config, sizing),
        _service(canary), *_pods(canary, sizing),
        _router_deployment(config, route), _pod_monitor(route),
    ]


def adapter_values(config: K8sConfig) -> dict:
    """A rule for prometheus-community/prometheus-adapter's Helm values (rules.custom): per pod, the gauge as
    scraped, so the autoscaler averages it over the pods of its Deployment."""
    return {"rules": {"custom": [{
        "seriesQuery": f'{waiting_series(config)}{{namespace!="",pod!=""}}',
        "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
        "name": {"matches": f"^{waiting_series(config)}$", "as": hpa_metric(config)},
        "metricsQuery": "sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)",
    }]}}


def _metadata(config: K8sConfig, name: str | None = None, **extra: dict) -> dict:
    labels = {**selector_labels(config), "app.kubernetes.io/version": __version__,
              "app.kubernetes.io/managed-by": "tally-deploy"}
    out = {"name": name or config.name, "labels": labels, **extra}
    if config.namespace is not None:
        out["namespace"] = config.namespace
    return out


def _pods(config: K8sConfig, sizing: PodSizing) -> list[dict]:
    return [_deployment(config, sizing), _autoscaler(config), _pod_monitor(config)]


def _service(config: K8sConfig, name: str | None = None) -> dict:
    """A Service (named `name`, else as `config`) in front of `config`'s pods."""
    return {"apiVersion": "v1", "kind": "Service", "metadata": _metadata(config, name),
            "spec": {"type": "ClusterIP", "selector": selector_labels(config),
                     "ports": [{"name": PORT_NAME, "port": PORT, "targetPort": PORT_NAME, "protocol": "TCP"}]}}


def _deployment(config: K8sConfig, sizing: PodSizing) -> dict:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": _metadata(config, annotations={"tally/memory-plan": sizing.summary()}),
        "spec": {
            "replicas": config.replicas,
            "selector": {"matchLabels": selector_labels(config)},
            # a new pod serves only once its model is loaded: keep every old one until then
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": pod_template(config, sizing),
        },
    }


def _router_deployment(config: K8sConfig, route: K8sConfig) -> dict:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": _metadata(route),
        "spec": {
            # One router: each runs its own canary controller, on the responses it alone saw.
            "replicas": 1,
            "selector": {"matchLabels": selector_labels(route)},
            # the entry point stays up while a new router starts (its plan starts over, as after any restart)
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": router_pod_template(config, route),
        },
    }


def _autoscaler(config: K8sConfig) -> dict:
    return {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": _metadata(config),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": config.name},
            "minReplicas": config.replicas,
            "maxReplicas": config.hpa_max_replicas,
            "metrics": [{"type": "Pods", "pods": {
                "metric": {"name": hpa_metric(config)},
                "target": {"type": "AverageValue", "averageValue": _quantity(config.target_waiting)}}}],
            # The queue stays long until a new pod has loaded its model, so adding more in the meantime
            # overshoots: at most double per minute. A pod given back costs a reload if the load returns.
            "behavior": {
                "scaleUp": {"stabilizationWindowSeconds": 0,
                            "policies": [{"type": "Percent", "value": 100, "periodSeconds": 60}]},
                "scaleDown": {"stabilizationWindowSeconds": 300,
                              "policies": [{"type": "Pods", "value": 1, "periodSeconds": 120}]},
            },
        },
    }


def _pod_monitor(config: K8sConfig) -> dict:
    metadata = _metadata(config)
    metadata["labels"].update(dict(config.monitor_labels))
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor", "metadata": metadata,
            "spec": {"selector": {"matchLabels": selector_labels(config)},
                     "podMetricsEndpoints": [{"port": PORT_NAME, "path": "/metrics", "interval": "15s"}]}}


def _quantity(value: float) -> str:
    """A Kubernetes quantity: 2 -> "2", 1.5 -> "1500m"."""
    return str(int(value)) if value == int(value) else f"{round(value * 1000)}m"
