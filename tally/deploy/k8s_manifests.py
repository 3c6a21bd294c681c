"""The objects `tally deploy k8s` writes: Deployment, Service, HorizontalPodAutoscaler on the waiting queue,
PodMonitor for the Prometheus Operator, and the Prometheus adapter rule that turns the scraped series into the
autoscaler's metric."""
from __future__ import annotations

from tally.deploy.k8s_config import METRICS_PREFIXES, K8sConfig
from tally.deploy.k8s_pod import PORT, PORT_NAME, pod_template, selector_labels
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


def manifests(config: K8sConfig, sizing: PodSizing) -> list[dict]:
    return [_service(config), _deployment(config, sizing), _autoscaler(config), _pod_monitor(config)]


def adapter_values(config: K8sConfig) -> dict:
    """A rule for prometheus-community/prometheus-adapter's Helm values (rules.custom): per pod, the gauge as
    scraped, so the autoscaler averages it over the pods of its Deployment."""
    return {"rules": {"custom": [{
        "seriesQuery": f'{waiting_series(config)}{{namespace!="",pod!=""}}',
        "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
        "name": {"matches": f"^{waiting_series(config)}$", "as": hpa_metric(config)},
        "metricsQuery": "sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)",
    }]}}


def _metadata(config: K8sConfig, **extra: dict) -> dict:
    labels = {**selector_labels(config), "app.kubernetes.io/version": __version__,
              "app.kubernetes.io/managed-by": "tally-deploy"}
    out = {"name": config.name, "labels": labels, **extra}
    if config.namespace is not None:
        out["namespace"] = config.namespace
    return out


def _service(config: K8sConfig) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": _metadata(config),
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
