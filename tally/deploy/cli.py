"""`tally deploy k8s`: Kubernetes manifests for the Tally image, each pod's memory sized by the ledger."""
from __future__ import annotations

import argparse
import math
import shlex
import sys
from pathlib import Path

import yaml

from tally.deploy.k8s_canary import CanaryRollout
from tally.deploy.k8s_config import CANARY, STABLE, K8sConfig
from tally.deploy.k8s_manifests import adapter_values, hpa_metric, manifests, pool_manifests, pool_parts
from tally.deploy.k8s_pod import PORT
from tally.deploy.k8s_pools import LengthPools
from tally.deploy.k8s_sizing import size_pod
from tally.errors import TallyError
from tally.flags import (
    CONCURRENCY,
    DRAIN_TIMEOUT,
    DTYPE,
    KV_CACHE_DTYPE,
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    METRICS_PREFIX,
    OUT,
    REPLICAS,
    SWAP_SPACE,
    HelpFormatter,
    parser,
)
from tally.units import parse_bytes, parse_pairs

EPILOG = """examples:
  tally deploy k8s --replicas 2 --out k8s/ && kubectl apply -f k8s/
  tally deploy k8s --model Llama-3.2-1B --model-pvc models --max-model-len 8192 --cpus 8 | kubectl apply -f -
  tally deploy k8s --replicas 2 --canary-image tally:0.2.0 --canary-plan 5%:2h,20%:2h,100% \
      --canary-rules rules.yaml --out k8s/          # a canary behind the tally route router, judged by rules.yaml
  tally deploy k8s --plan plan.json --replicas 2 --out k8s/   # the main and long pools of tally plan --out
"""
ADAPTER_FILE = "prometheus-adapter/values.yaml"  # a folder down: `kubectl apply -f DIR` does not descend into it


class ManifestDumper(yaml.SafeDumper):
    """Text of several lines (the router's rules file in its ConfigMap) as a YAML block, readable as written."""


ManifestDumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


def build_parser() -> argparse.ArgumentParser:
    p = parser("tally deploy", __doc__)
    targets = p.add_subparsers(dest="target", required=True, metavar="k8s")
    k = targets.add_parser("k8s", description=__doc__, epilog=EPILOG, formatter_class=HelpFormatter,
                           help="Deployment, Service, HorizontalPodAutoscaler and PodMonitor")
    k.add_argument("--model", default=K8sConfig.model,
                   help="the built-in smollm2-135m (in the image; default), or a checkpoint dir, .gguf file or "
                        "`tally plan` preset to size, served from --model-pvc")
    REPLICAS.add(k, default=K8sConfig.replicas, note=": pods to start with; the autoscaler's floor")
    k.add_argument("--max-replicas", type=int, help="the autoscaler's ceiling (default: twice --replicas)")
    MAX_MODEL_LEN.add(k)
    k.add_argument("--plan", type=Path, metavar="FILE",
                   help="a `tally plan --lengths ... --out FILE` result: a main and a long pool, each at its "
                        "max_model_len (--replicas pods for the main one, the plan's share for the long one), and "
                        "the tally route router in front sending each request to its pool by length")
    CONCURRENCY.add(k, default=K8sConfig.concurrency, note=" in each pod: its KV pool holds this many requests of "
                                                           "--max-model-len tokens; shorter requests share it")
    MAX_NUM_SEQS.add(k, default=None, note=" (default: tally serve's)")
    DTYPE.add(k, note="; the pods are sized for auto as fp32 arithmetic on any AVX2 CPU: float32 for a .gguf or "
                      "fp32 model, else float16; give bfloat16 where the nodes have bf16 instructions")
    KV_CACHE_DTYPE.add(k)
    k.add_argument("--cpus", type=int, default=K8sConfig.cpus, help="whole CPUs per pod")
    k.add_argument("--reserve", default="1GiB", help="memory beyond weights and KV: Python, torch, the server, "
                                                     "activations")
    SWAP_SPACE.add(k, default=None, note="; in each pod's memory request (default: the KV pool's size, at most "
                                         f"tally serve's {SWAP_SPACE.default:g} GiB)")
    k.add_argument("--name", default=K8sConfig.name, help="of every object")
    k.add_argument("--namespace", help="default: the one `kubectl apply` uses")
    k.add_argument("--image", default=K8sConfig.image, help="built from the Dockerfile")
    k.add_argument("--model-pvc", metavar="CLAIM", help="PersistentVolumeClaim with the checkpoint, at /models")
    k.add_argument("--api-key-secret", metavar="SECRET", help="a Secret whose key `api-key` guards /v1/*")
    METRICS_PREFIX.add(k)
    k.add_argument("--target-waiting", type=float, default=K8sConfig.target_waiting,
                   help="requests waiting per pod above which the autoscaler adds pods")
    k.add_argument("--monitor-label", action="append", default=[], metavar="KEY=VALUE",
                   help="a label on the PodMonitor, for the Prometheus that selects by it (e.g. release=prometheus)")
    k.add_argument("--startup-timeout", type=int, default=K8sConfig.startup_timeout_s,
                   help="seconds a pod may take to load its model")
    DRAIN_TIMEOUT.add(k, note="; the pods' tally serve --drain-timeout")
    OUT.add(k, note=": a folder, one file per object (default: all to stdout)")
    c = k.add_argument_group("canary release behind the `tally route` router (docs/deploy.md)")
    c.add_argument("--canary", metavar="FLAGS",
                   help="tally serve flags for the canary's pods, after the stable pods' own (e.g. '--max-num-seqs "
                        "32'; one word as --canary=--flag); the router in front takes the Service name --name")
    c.add_argument("--canary-image", metavar="IMAGE", help="the canary pods' image (default: --image)")
    c.add_argument("--canary-replicas", type=int, help="canary pods to start with; its autoscaler's floor (default 1)")
    c.add_argument("--canary-plan", metavar="PLAN", help="tally route --plan: weights and how long each must hold, "
                                                          "e.g. 5%%:2h,20%%:2h,50%%:2h,100%%")
    c.add_argument("--canary-rules", type=Path, metavar="FILE",
                   help="tally route --rules: the rollback rules (YAML), checked now and put in a ConfigMap")
    c.add_argument("--canary-eval-interval", metavar="DURATION", help="tally route --eval-interval (default 5s)")
    c.add_argument("--canary-sticky-header", metavar="NAME", help="tally route --sticky-header, e.g. X-Session-Id")
    return p


def config_from_args(ns: argparse.Namespace) -> K8sConfig:
    labels = {}
    for text in ns.monitor_label:
        labels.update(parse_pairs(text, "--monitor-label"))
    return K8sConfig(
        model=ns.model, replicas=ns.replicas, max_replicas=ns.max_replicas, name=ns.name, namespace=ns.namespace,
        image=ns.image, max_model_len=ns.max_model_len, concurrency=ns.concurrency, max_num_seqs=ns.max_num_seqs,
        dtype=None if ns.dtype == "auto" else ns.dtype, kv_cache_dtype=ns.kv_cache_dtype, cpus=ns.cpus,
        reserve_bytes=parse_bytes(ns.reserve, what="--reserve"), swap_space_gib=ns.swap_space, model_pvc=ns.model_pvc,
        metrics_prefix=ns.metrics_prefix, target_waiting=ns.target_waiting,
        startup_timeout_s=ns.startup_timeout, drain_timeout_s=math.ceil(ns.drain_timeout),
        api_key_secret=ns.api_key_secret,
        monitor_labels=tuple(labels.items()),
        canary=CanaryRollout.from_args(ns.canary, ns.canary_image, ns.canary_replicas, ns.canary_plan,
                                       ns.canary_rules, ns.canary_eval_interval, ns.canary_sticky_header),
        pools=LengthPools.from_plan(ns.plan) if ns.plan is not None else None)


def main(argv: list[str]) -> int:
    ns = build_parser().parse_args(argv)
    try:
        config = config_from_args(ns)
        if config.pools is None:
            sizing = size_pod(config)
            docs = manifests(config, sizing)
        else:
            sizings = {pool: size_pod(part) for pool, part in pool_parts(config).items()}
            docs, sizing = pool_manifests(config, sizings), None
    except TallyError as exc:
        print(f"tally deploy {ns.target}: {exc.message}", file=sys.stderr)
        return 2
    header = f"# written by: tally deploy {shlex.join(argv)}\n"
    adapter = (f"the autoscaler reads {hpa_metric(config)}, which the Prometheus adapter makes of what the "
               "PodMonitor scrapes")
    if sizing is not None:
        summary = sizing.summary()
    else:
        summary = "\n".join(f"pool {pool}: {s.summary()}" for pool, s in sizings.items()) + (
            f"\nclients use Service {config.name} (port {PORT}): the tally route router, which sends requests above "
            f"{config.pools.threshold_tokens:,} tokens (prompt + max_tokens) to pool long, the others to pool main")
    if config.canary is not None:
        summary += (f"\nclients use Service {config.name} (port {PORT}): the tally route router, which sends the "
                    f"canary ({config.name}-{CANARY}) its share of new requests and the rest to the stable pods "
                    f"({config.name}-{STABLE})")
    if ns.out is None:
        sys.stdout.write(header + yaml.dump_all(docs, Dumper=ManifestDumper, sort_keys=False))
        print(f"{summary}\n{adapter}: --out DIR writes the adapter's rule too (docs/deploy.md)", file=sys.stderr)
        return 0
    if ns.out.exists() and not ns.out.is_dir():
        print(f"tally deploy {ns.target}: --out {ns.out} is a file; give a folder", file=sys.stderr)
        return 2
    (ns.out / ADAPTER_FILE).parent.mkdir(parents=True, exist_ok=True)
    for doc in docs:
        path = ns.out / f"{doc['metadata']['name']}-{doc['kind'].lower()}.yaml"
        path.write_text(header + yaml.dump(doc, Dumper=ManifestDumper, sort_keys=False))
    (ns.out / ADAPTER_FILE).write_text(header + yaml.safe_dump(adapter_values(config), sort_keys=False))
    print(f"{summary}\nwrote {len(docs)} manifests to {ns.out} (kubectl apply -f {ns.out}); {adapter}: "
          f"its rule is {ns.out / ADAPTER_FILE} (helm upgrade prometheus-adapter "
          "prometheus-community/prometheus-adapter -f that file)")
    return 0
