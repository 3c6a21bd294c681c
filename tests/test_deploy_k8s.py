"""`tally deploy k8s` end to end, through the CLI: the manifests pass Kubernetes' own schemas (the PodMonitor, a CRD
they do not hold, a schema of ours), each pod asks for the memory `tally plan` prints, the pod's command line is one
`tally serve` accepts and whose engine allocates that KV pool, a canary comes with the `tally route` router in front
whose command line `tally route` accepts, and bad options are refused with what to fix."""
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


def _files(tmp_path, *args: str) -> dict[str, dict]:
    """Each manifest written, by its file's name (tally-route-deployment)."""
    out = tmp_path / "k8s"
    assert main(["deploy", "k8s", *args, "--out", str(out)]) == 0
    return {path.stem: yaml.safe_load(path.read_text()) for path in sorted(out.glob("*.yaml"))}


def _deploy(tmp_path, *args: str) -> dict[str, dict]:
    """The manifests of one pod set, by kind, and the adapter's values."""
    docs = {doc["kind"]: doc for doc in _files(tmp_path, *args).values()}
    docs["adapter"] = yaml.safe_load((tmp_path / "k8s" / "prometheus-adapter" / "values.yaml").read_text())
    return docs


def _container(docs: dict) -> dict:
    return docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]


def _arg(container: dict, flag: str) -> str:
    args = container["args"]
    return args[args.index(flag) + 1]


def _planned_memory(capsys, case: dict, concurrency: int, reserve: str) -> tuple[int, int, int]:
    """What `tally plan` says one pod needs: weights, KV for `concurrency` requests of max_model_len, the reserve."""
    assert main(["plan", "--model", case["plan_model"], "--dtype", case["dtype"], "--kv-cache-dtype", case["kv_dtype"],
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
        # a GGUF's blocks as stored, computed in fp32: an fp16 cache (ledger/kv.py: auto_kv_dtype)
        "builtin": dict(args=[], plan_model=str(resolve_model(None).path), dtype="float32", kv_dtype="float16",
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
    swap = min(4.0, kv / 2**30)  # a pool's worth of preempted blocks, at most tally serve's default
    assert float(_arg(container, "--swap-space")) == swap
    assert int(container["resources"]["requests"]["memory"]) == weights + kv + int(swap * 2**30) + reserved
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
    swap = ledger.kv_tiers["swap_space"]["capacity_bytes"]
    assert swap == ledger.kv_pool_bytes  # the pod's swap space: its pool's worth, in its memory request
    assert ledger.weight_bytes + ledger.kv_pool_bytes + swap < int(container["resources"]["requests"]["memory"])
    assert ledger.max_concurrency_at_max_len == 3
    assert ledger.weight_bytes + ledger.kv_pool_bytes < int(container["resources"]["requests"]["memory"])


def test_swap_space_is_the_users_and_in_the_memory_request(tmp_path):
    memory = {}
    for swap in ("0", "0.5"):
        container = _container(_deploy(tmp_path / swap, "--swap-space", swap))
        assert float(_arg(container, "--swap-space")) == float(swap)
        memory[swap] = int(container["resources"]["requests"]["memory"])
    assert memory["0.5"] - memory["0"] == 2**29


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


RULES = """min_samples: 20
window: 5m
rules:
  - {metric: ttft_p99, max_ratio: 1.5}
  - {metric: error_rate, max_increase: 1%}
"""
PLAN = "5%:2h,20%:2h,100%"


@pytest.fixture
def rules(tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    return path


def _canary(rules, *args: str) -> list[str]:
    return ["--canary", "--max-num-seqs 32", "--canary-image", "tally:0.2.0", "--canary-plan", PLAN,
            "--canary-rules", str(rules), *args]


def _spec(doc: dict) -> dict:
    return doc["spec"]["template"]["spec"]


def _selects(service: dict, deployment: dict) -> bool:
    return service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


def test_a_canary_comes_with_its_own_pods_and_the_router_as_the_entry_point(tmp_path, rules):
    files = _files(tmp_path, *_canary(rules, "--replicas", "2", "--namespace", "llm"))
    stable, canary, router = (files[f"{name}-deployment"] for name in ("tally", "tally-canary", "tally-route"))
    for name, doc in files.items():
        if doc["kind"] == "PodMonitor":
            jsonschema.validate(doc, POD_MONITOR_SCHEMA)
        else:
            for version in K8S_VERSIONS:
                kubernetes_validate.validate(doc, version, strict=True)
        assert doc["metadata"]["namespace"] == "llm", name
    # Clients keep the name they used without a canary; it now reaches the router, and each side has its own.
    assert _selects(files["tally-service"], router)
    assert not _selects(files["tally-service"], stable) and not _selects(files["tally-service"], canary)
    assert _selects(files["tally-stable-service"], stable) and not _selects(files["tally-stable-service"], canary)
    assert _selects(files["tally-canary-service"], canary) and not _selects(files["tally-canary-service"], stable)
    assert files["tally-canary-horizontalpodautoscaler"]["spec"]["scaleTargetRef"]["name"] == "tally-canary"
    assert files["tally-canary-horizontalpodautoscaler"]["spec"]["maxReplicas"] == 4
    # The canary's pods: the stable pod template, its image, its flags last, sized alike.
    stable_pod, canary_pod = _spec(stable)["containers"][0], _spec(canary)["containers"][0]
    assert (stable_pod["image"], canary_pod["image"]) == ("tally:0.1.0", "tally:0.2.0")
    assert canary_pod["args"] == stable_pod["args"] + ["--max-num-seqs", "32"]
    assert canary_pod["resources"] == stable_pod["resources"]
    # The router: one pod, small and stated, its rules from the ConfigMap, probes that never restart it for a
    # side with no healthy pod (/health is 503 then).
    assert router["spec"]["replicas"] == 1
    (route,) = _spec(router)["containers"]
    assert route["command"] == ["tally", "route"] and route["image"] == stable_pod["image"]
    assert route["resources"] == {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}}
    assert route["readinessProbe"]["httpGet"]["path"] == "/health"
    assert route["livenessProbe"]["httpGet"]["path"] == "/router/status"
    (volume,) = _spec(router)["volumes"]
    assert volume["configMap"]["name"] == files["tally-route-configmap"]["metadata"]["name"]
    assert files["tally-route-configmap"]["data"] == {"rules.yaml": RULES}
    (mount,) = route["volumeMounts"]
    assert _arg(route, "--rules") == f"{mount['mountPath']}/rules.yaml"
    assert files["tally-route-podmonitor"]["spec"]["selector"]["matchLabels"].items() <= \
        router["spec"]["template"]["metadata"]["labels"].items()


def test_the_router_command_line_is_one_tally_route_accepts(tmp_path, rules, monkeypatch):
    from tally.ops import route_cli

    files = _files(tmp_path, *_canary(rules, "--canary-eval-interval", "10s", "--canary-sticky-header", "X-Session"))
    (route,) = _spec(files["tally-route-deployment"])["containers"]
    mounted = tmp_path / "mounted-rules.yaml"  # where the kubelet puts the ConfigMap's file
    mounted.write_text(files["tally-route-configmap"]["data"]["rules.yaml"])
    args = route["args"]
    args[args.index("--rules") + 1] = str(mounted)
    started = {}
    monkeypatch.setattr(route_cli, "build_router_app", lambda config: started.setdefault("config", config))
    monkeypatch.setattr(route_cli.uvicorn, "run", lambda app, **kwargs: started.update(kwargs))
    assert route_cli.main(args) == 0
    config = started["config"]
    assert (started["host"], started["port"]) == ("0.0.0.0", route["ports"][0]["containerPort"])
    port = files["tally-stable-service"]["spec"]["ports"][0]["port"]
    assert config.pools.pools == (("main", (f"http://tally-stable:{port}",)),)
    assert config.canary.urls == (f"http://tally-canary:{files['tally-canary-service']['spec']['ports'][0]['port']}",)
    assert [step.weight for step in config.canary.plan] == [0.05, 0.2, 1.0]
    assert (config.canary.eval_interval_s, config.canary.sticky_header) == (10.0, "X-Session")
    assert [rule.metric for rule in config.canary.rules.rules] == ["ttft_p99", "error_rate"]


def test_the_canary_pods_command_line_is_one_tally_serve_accepts_with_its_flags(tmp_path, rules):
    from tally.server.cli import parse_args

    files = _files(tmp_path, *_canary(rules, "--max-num-seqs", "8"))
    stable, canary = (parse_args(_spec(files[f"{name}-deployment"])["containers"][0]["args"])
                      for name in ("tally", "tally-canary"))
    assert (stable.max_num_seqs, canary.max_num_seqs) == (8, 32)
    assert canary.kv_cache_memory == stable.kv_cache_memory and canary.model == stable.model


BAD_RULES = {
    "unknown_metric": "rules:\n  - {metric: latency, max_ratio: 1.5}\n",
    "backend": "rules:\n  - {metric: ttft_p99, max_ratio: 1.5, source: backend}\n",
    "short_window": "window: 5s\nrules:\n  - {metric: ttft_p99, max_ratio: 1.5}\n",
}


@pytest.mark.parametrize("args, message", [
    (["--canary-plan", PLAN], "--canary-plan, --canary-rules, --canary-replicas"),
    (["--canary-image", "tally:0.2.0", "--canary-plan", PLAN], "a canary needs --canary-plan"),
    (["--canary", "--max-num-seqs 32", "--canary-rules", "{rules}"], "a canary needs --canary-plan"),
    (["--canary-image", "tally:0.1.0", "--canary-plan", PLAN, "--canary-rules", "{rules}"],
     "the canary would run what the stable pods run"),
    (_canary("/no/such/rules.yaml"), "--rules /no/such/rules.yaml: cannot read it"),
    (_canary("{unknown_metric}"), "unknown metric 'latency'"),
    (_canary("{backend}"), "source: backend"),
    (_canary("{short_window}", "--canary-eval-interval", "10s"), "shorter than --eval-interval"),
    (["--canary-image", "tally:0.2.0", "--canary-plan", "5%:2h,50%", "--canary-rules", "{rules}"],
     "must end with a bare 100%"),
    (["--canary", "--max-model-len 4096", "--canary-plan", PLAN, "--canary-rules", "{rules}"],
     "--canary cannot set --max-model-len"),
    (["--canary=--kv-cache-mem=1GB", "--canary-plan", PLAN, "--canary-rules", "{rules}"],
     "--canary cannot set --kv-cache-memory"),
    (["--canary", "--chat-template 'unclosed", "--canary-plan", PLAN, "--canary-rules", "{rules}"],
     "cannot be split into flags"),
    (_canary("{rules}", "--canary-replicas", "3"), "--canary-replicas 3 is above the autoscaler's ceiling (2"),
    (_canary("{rules}", "--name", "t" * 60), "too long for a canary"),
])
def test_bad_canary_options_are_refused_before_any_manifest_is_written(tmp_path, rules, capsys, args, message):
    for name, text in BAD_RULES.items():
        (tmp_path / f"{name}.yaml").write_text(text)
    paths = {"rules": rules, **{name: tmp_path / f"{name}.yaml" for name in BAD_RULES}}
    out = tmp_path / "k8s"
    assert main(["deploy", "k8s", *(a.format(**paths) for a in args), "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.out == ""
    assert not out.exists()


def test_a_length_plan_writes_both_pools_and_the_router_that_splits_them(tmp_path, monkeypatch):
    """`tally plan --lengths --out` → `tally deploy k8s --plan`: each pool's pods start at its own max_model_len and
    the router's command line is one `tally route` accepts, with the plan's threshold."""
    from tally.ops import route_cli

    plan = tmp_path / "plan.json"
    assert main(["plan", "--model", "smollm2-135m", "--device", "h100-80gb", "--lengths", "conv",
                 "--out", str(plan)]) == 0
    pools = json.loads(plan.read_text())["pools"]
    files = _files(tmp_path / "k8s", "--plan", str(plan), "--replicas", "3")
    for doc in files.values():
        if doc["kind"] != "PodMonitor":
            kubernetes_validate.validate(doc, K8S_VERSIONS[-1], strict=True)
    lens = {pool: int(_arg(_spec(files[f"tally-{pool}-deployment"])["containers"][0], "--max-model-len"))
            for pool in ("main", "long")}
    assert lens == {"main": pools["main"]["max_model_len"], "long": pools["long"]["max_model_len"]}
    assert lens["main"] < lens["long"]
    assert files["tally-main-deployment"]["spec"]["replicas"] == 3 and files["tally-long-deployment"]["spec"][
        "replicas"] >= 1
    router = files["tally-route-deployment"]
    assert _selects(files["tally-service"], router)
    (route,) = _spec(router)["containers"]
    started = {}
    monkeypatch.setattr(route_cli, "build_router_app", lambda config: started.setdefault("config", config))
    monkeypatch.setattr(route_cli.uvicorn, "run", lambda app, **kwargs: None)
    assert route_cli.main(route["args"]) == 0
    config = started["config"].pools
    assert (config.long_pool, config.long_threshold_tokens) == ("long", pools["long_threshold_tokens"])
    assert config.pools == (("main", ("http://tally-main:8000",)), ("long", ("http://tally-long:8000",)))
    # the router reads the plan file itself too
    assert route_cli.PoolsConfig.from_args(None, ["main=http://a", "long=http://b"], "long", str(plan)) \
        .long_threshold_tokens == pools["long_threshold_tokens"]
