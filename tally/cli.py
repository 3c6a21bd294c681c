"""`tally <verb>`: each verb lives in the folder that owns it and is imported only when used,
so `tally plan` and `tally bench` start without torch."""
from __future__ import annotations

import importlib
import sys

VERBS: dict[str, tuple[str, str]] = {
    "serve": ("tally.deploy.serve_cli", "OpenAI-compatible HTTP server (--ray: replicas on Ray Serve)"),
    "run-batch": ("tally.server.run_batch", "run an OpenAI batch file (JSON lines) offline, as vllm run-batch"),
    "generate": ("tally.engine.cli", "generate text from a prompt, streamed to the terminal"),
    "tune": ("tally.engine.tune_cli", "measure which projection path is fastest on this CPU (cached for starts)"),
    "plan": ("tally.ledger.cli", "memory and capacity plan before allocation"),
    "bench": ("tally.bench.cli", "load test any OpenAI-compatible server"),
    "quantize": ("tally.quantize.cli", "quantize a checkpoint (rtn / gptq / awq)"),
    "eval": ("tally.quality.cli", "quality gate: candidate vs baseline"),
    "alerts": ("tally.ops.alerts_cli", "Prometheus alert rules from a measured baseline run"),
    "dashboards": ("tally.ops.dashboards_cli", "Grafana dashboard and Prometheus recording rules"),
    "route": ("tally.ops.route_cli", "one address in front of replicas: balancing, health checks, failover"),
    "deploy": ("tally.deploy.cli", "Kubernetes manifests for the Tally image, pods sized by the ledger (deploy k8s)"),
}


def _usage() -> str:
    lines = ["usage: tally <verb> [options]", "", "verbs:"]
    lines += [f"  {verb:<10} {desc}" for verb, (_, desc) in VERBS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    verb, rest = argv[0], argv[1:]
    if verb not in VERBS:
        print(f"tally: unknown verb {verb!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(VERBS[verb][0])
    except ModuleNotFoundError as exc:
        print(f"tally {verb}: not available in this build ({exc})", file=sys.stderr)
        return 2
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
