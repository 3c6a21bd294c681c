"""`tally deploy k8s` end to end, through the CLI: the manifests pass Kubernetes' own schemas (the PodMonitor, a CRD
they do not hold, a schema of ours), each pod asks for the memory `tally plan` prints, the pod's command line is one
`tally serve` accepts and whose engine allocates that KV pool, and bad options are refused with what to fix."""
from __future__ import annotations

import json

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tally.cli import main
from tally.deploy.k8s_config import METRICS_PREFIXES
from tally.models.registry import resolve_model

K8S_VERSIONS = ("1.25.0", "1.37.0")  # the oldest and newest kubernetes-validate ships
PRESET = "Llama-3.1-8B"

# The fields of monitoring.coreos.com/v1 PodMonitor that the Prometheus Operator needs to scrape our pods, as its
# CRD states them (selector, podMetricsEndpoints[].port / path / interval); kubernetes-validate has no CRDs.
POD_MONITOR_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PodMonitor"},
        "metadata": {"type": "object", "required": ["name"],
                     "properties": {"name": {"type": "string"}, "namespace": {"type": "string"},
                                    "labels": {"type": "object", "additionalProperties": {"type": "string"}}}},
        "spec": {
            "type": "object", "required": ["selector", "podMetricsEndpoints"], "additionalProperties": False,
            "properties": {
                "selector": {"type": "object", "required": ["matchLabels"], "additionalProperties": False,
                             "properties": {"matchLabels": {"type": "object", "minProperties": 1,
                                                            "additionalProperties": {"type": "string"}}}},
                "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "required": ["port"], "additionalProperties": False,
                    "properties": {"port": {"type": "string"}, "path": {"type": "string", "pattern": "^/"},
                                   "interval": {"type": "string", "pattern": r"^(0|(([0-9]+)(ms|s|m|h))+)$"}}}},
            },
        },
    },
}


def _deploy(tmp_path, *args: str) -> dict[str, dict]:
    out = tmp_path / "k8s"
    assert main(["deploy", "k8s", *args, "--out", str(out)]) == 0
    docs = {}
    for path in sorted(out.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        docs[doc["kind"]] = doc
    docs["adapter"] = yaml.safe_load((out / "prometheus-adapter" / "values.yaml").read_text())
    return docs


def _container(docs: dict) -> dict:
    return docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]


def _arg(container: dict, flag: str) -> str:
    args = container["args"]
    return args[args.index(flag) + 1]


def _planned_memory(capsys, case: dict, concurrency: int, reserve: str) -> tuple[int, int, int]:
    """What `tally plan` says one pod needs: weights, KV for `concurrency` requests of max_model_len, the reserve."""
    assert main(["plan", "--model", case["plan_model"], "--dtype", case["dtype"], "--kv-dtype", case["kv_dtype"],
                 "--max-model-len", str(case["max_model_len"]), "--concurrency", str(concurrency),
                 "--reserve", reserve, "--memory", "1TiB", "--bandwidth", "100GB/s", "--flops", "1T", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    return (plan["weights"]["per_device_bytes"], concurrency * plan["kv"]["bytes_per_request_per_device"],
            plan["memory"]["reserve_bytes"])


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    from support.tiny_models import make_checkpoint

    return make_checkpoint(tmp_path_factory.mktemp("tiny-deploy") / "tiny-llama")


@pytest.fixture(scope="module")
def tiny_bf16_checkpoint(tmp_path_factory):
    """A half-precision checkpoint, as its config says: served by default as fp16 weights with fp32 arithmetic."""
    from support.tiny_models import make_checkpoint

    path = make_checkpoint(tmp_path_factory.mktemp("tiny-deploy") / "tiny-bf16")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "torch_dtype": "bfloat16", "dtype": "bfloat16"}))
    return path


@pytest.fixture(params=["builtin", "tiny", "preset"])
def model_case(request, tiny_checkpoint) -> dict:
    """Three sizes: the built-in GGUF (in the image), a tiny HF checkpoint and an 8B preset (on a claim)."""
    return {
        "builtin": dict(args=[], plan_model=str(resolve_model(None).path), dtype="float32", kv_dtype="float32",
                        max_model_len=8192, model_arg="smollm2-135m"),
        "tiny": dict(args=["--model", str(tiny_checkpoint), "--model-pvc", "models"], plan_model=str(tiny_checkpoint),
                     dtype="float32", kv_dtype="float32", max_model_len=256, model_arg="/models/tiny-llama"),
        "preset": dict(args=["--model", PRESET, "--model-pvc", "models", "--max-model-len", "8192", "--cpus", "16",
                             "--reserve", "2GiB"], plan_model=PRESET, dtype="float16", kv_dtype="float32",
                       max_model_len=8192, model_arg=f"/models/{PRESET}"),
    }[request.param]


@pytest.mark.parametrize("replicas", [1, 3])
def test_manifests_pass_the_kubernetes_schemas(tmp_path, model_case, replicas):
    docs = _deploy(tmp_path, *model_case["args"], "--replicas", str(replicas), "--namespace", "llm")
    for kind in ("Deployment", "Service", "HorizontalPodAutoscaler"):
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(docs[kind], version, strict=True)
    jsonschema.validate(docs["PodMonitor"], POD_MONITOR_SCHEMA)
    assert docs["Deployment"]["spec"]["replicas"] == docs["HorizontalPodAutoscaler"]["spec"]["minReplicas"] == replicas
    assert docs["HorizontalPodAutoscaler"]["spec"]["maxReplicas"] == 2 * replicas
    assert all(d["metadata"]["namespace"] == "llm" for k, d in docs.items() if k != "adapter")
    assert _arg(_container(docs), "--model") == model_case["model_arg"]


def test_the_memory_request_is_the_ledgers_figure(tmp_path, capsys, model_case):
    docs = _deploy(tmp_path, *model_case["args"])
    capsys.readouterr()
    container = _container(docs)
    reserve = "2GiB" if "--reserve" in model_case["args"] else "1GiB"
    weights, kv, reserved = _planned_memory(capsys, model_case, 8, reserve)
    assert int(container["resources"]["requests"]["memory"]) == weights + kv + reserved
    assert container["resources"]["limits"] == container["resources"]["requests"]
    assert int(_arg(container, "--kv-cache-memory")) == kv  # the pool the engine allocates, not one of its choosing
    assert _arg(container, "--dtype") == model_case["dtype"]
    assert _arg(container, "--max-model-len") == str(model_case["max_model_len"])


@pytest.mark.parametrize("dtype", [None, "bfloat16", "float32"])
def test_the_pod_command_line_starts_an_engine_with_the_planned_kv_pool(tmp_path, tiny_bf16_checkpoint, dtype):
    from tally.engine.args import config_from_args
    from tally.engine.engine import Engine
    from tally.server.cli import parse_args

    container = _container(_deploy(tmp_path, "--model", str(tiny_bf16_checkpoint), "--model-pvc", "models",
                                   "--concurrency", "3", *(["--dtype", dtype] if dtype else [])))
    args = container["args"]
    assert _arg(container, "--dtype") == (dtype or "float16")
    args[args.index("--model") + 1] = str(tiny_bf16_checkpoint)  # where the claim would be mounted
    ns = parse_args(args)
    assert (ns.host, ns.port) == ("0.0.0.0", container["ports"][0]["containerPort"])
    ledger = Engine(config_from_args(ns)).ledger
    assert ledger.kv_pool_bytes == int(_arg(container, "--kv-cache-memory"))
    assert ledger.max_concurrency_at_max_len == 3
    assert ledger.weight_bytes + ledger.kv_pool_bytes < int(container["resources"]["requests"]["memory"])


def test_probes_and_monitor_point_at_the_servers_port_and_health(tmp_path):
    docs = _deploy(tmp_path, "--monitor-label", "release=prometheus")
    container = _container(docs)
    port = container["ports"][0]["name"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": port}
    live, start = container["livenessProbe"], container["startupProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] >= 120  # a long prefill is not a dead server
    assert start["periodSeconds"] * start["failureThreshold"] >= 600  # loading the model is not either
    assert docs["Service"]["spec"]["ports"][0]["targetPort"] == port
    assert docs["PodMonitor"]["spec"]["podMetricsEndpoints"][0]["port"] == port
    labels = docs["Deployment"]["spec"]["template"]["metadata"]["labels"]
    for selector in (docs["Service"]["spec"]["selector"], docs["PodMonitor"]["spec"]["selector"]["matchLabels"],
                     docs["Deployment"]["spec"]["selector"]["matchLabels"]):
        assert selector.items() <= labels.items()
    assert docs["PodMonitor"]["metadata"]["labels"]["release"] == "prometheus"
    assert docs["Deployment"]["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_an_api_key_comes_from_a_secret_the_server_reads(tmp_path, monkeypatch):
    from tally.server.cli import parse_args

    docs = _deploy(tmp_path, "--api-key-secret", "tally-key")
    kubernetes_validate.validate(docs["Deployment"], K8S_VERSIONS[-1], strict=True)
    (env,) = _container(docs)["env"]
    assert env["valueFrom"]["secretKeyRef"] == {"name": "tally-key", "key": "api-key"}
    monkeypatch.setenv(env["name"], "s3cret")  # what the kubelet does with the Secret's value
    assert parse_args(_container(docs)["args"]).api_key == "s3cret"


@pytest.mark.parametrize("prefix", sorted(METRICS_PREFIXES))
def test_the_autoscaler_reads_the_gauge_the_server_exports(tmp_path, prefix):
    from tally.engine.snapshot import EngineSnapshot
    from tally.server.metrics import METRICS_PREFIXES as SERVER_PREFIXES
    from tally.server.metrics import ServerMetrics

    assert METRICS_PREFIXES == SERVER_PREFIXES
    docs = _deploy(tmp_path, "--metrics-prefix", prefix, "--target-waiting", "1.5")
    rule = docs["adapter"]["rules"]["custom"][0]
    series = rule["seriesQuery"].split("{")[0]
    exported = ServerMetrics("m", EngineSnapshot, SERVER_PREFIXES[prefix]).render().decode()
    assert f"\n{series}{{" in exported
    metric = docs["HorizontalPodAutoscaler"]["spec"]["metrics"][0]["pods"]
    assert metric["metric"]["name"] == rule["name"]["as"] == f"{prefix}_num_requests_waiting"
    assert metric["target"] == {"type": "AverageValue", "averageValue": "1500m"}
    assert _arg(_container(docs), "--metrics-prefix") == prefix


def test_without_out_the_manifests_go_to_stdout(capsys):
    assert main(["deploy", "k8s", "--replicas", "2"]) == 0
    captured = capsys.readouterr()
    kinds = [d["kind"] for d in yaml.safe_load_all(captured.out)]
    assert kinds == ["Service", "Deployment", "HorizontalPodAutoscaler", "PodMonitor"]
    assert "per pod" in captured.err


@pytest.mark.parametrize("args, message", [
    (["--replicas", "0"], "--replicas must be at least 1"),
    (["--replicas", "3", "--max-replicas", "2"], "--max-replicas 2 is below --replicas 3"),
    (["--model", "/no/such/checkpoint"], "neither a checkpoint directory"),
    (["--model", PRESET], "--model-pvc"),
    (["--max-model-len", "100000"], "exceeds the context"),
    (["--name", "Tally_1"], "is not a Kubernetes name"),
    (["--target-waiting", "0"], "--target-waiting must be above 0"),
    (["--cpus", "0"], "--cpus must be at least 1"),
    (["--reserve", "lots"], "cannot read --reserve"),
])
def test_bad_options_are_refused_with_what_to_fix(capsys, args, message):
    assert main(["deploy", "k8s", *args]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.out == ""
