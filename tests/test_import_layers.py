"""The house rule, checked on the code itself: tally's layers import only downward, with no import circles, counting
every import (inside functions and `if TYPE_CHECKING:` blocks too). docs/architecture.md draws the same layers."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tally"

# Bottom to top. A module may import its own layer's modules and those of lower layers; never a higher one.
LAYERS: list[tuple[str, ...]] = [
    ("tally.errors", "tally.outputs", "tally.sampling_params", "tally.pooling_params", "tally.lora_request",
     "tally.platform", "tally.units", "tally.ports", "tally.traces", "tally.version", "tally.flags", "tally.progress",
     "tally.metric_names", "tally.prometheus_text", "tally.http_limits", "tally.json_text"),
    ("tally.native",),
    ("tally.core",),
    ("tally.attention",),
    ("tally.quant",),
    ("tally.layers", "tally.sample"),
    ("tally.models",),
    ("tally.ledger",),
    ("tally.engine",),
    ("tally.server", "tally.quality", "tally.quantize", "tally.deploy"),
    ("tally", "tally.cli"),  # the package's front door: `from tally import LLM`, the `tally` command
]
# The load generator talks HTTP to any server: it may use the bottom layer's helpers and nothing of the engine.
BENCH = "tally.bench"
# Operations sit beside it (HTTP and Prometheus only): the bottom layer, and the load generator's result files that
# alert thresholds come from.
OPS = "tally.ops"
# Deployment writes the manifests that run the operations tools (`tally route` as a canary router) and checks
# their settings with the tools' own validators, so it may import them; ops imports nothing of it, so no circle.
DEPLOY = "tally.deploy"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every tally module `path` imports, wherever the import statement stands."""
    tree = ast.parse(path.read_text(), str(path))
    own = _module_name(path)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            # `from tally.quant import int4pack` imports a module, not a name
            found |= {f"{base}.{a.name}" for a in node.names if _is_module(f"{base}.{a.name}")}
    return {m for m in found if m == "tally" or m.startswith("tally.")}


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _layer(module: str) -> int | str:
    for side in (BENCH, OPS):
        if module == side or module.startswith(side + "."):
            return side
    best = None
    for rank, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > len(best[1]):
                    best = (rank, prefix)
    assert best is not None, f"{module} is in no layer of this test; add its folder to LAYERS"
    return best[0]


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: {m for m in _imports(path) if m in modules and m != name} for name, path in modules.items()}


def test_every_import_points_down_a_layer_or_stays_in_its_own():
    upward = []
    for module, targets in _graph().items():
        rank = _layer(module)
        for target in targets:
            to = _layer(target)
            if rank == BENCH:
                ok = to == BENCH or to == 0
            elif rank == OPS:
                ok = to in (OPS, BENCH, 0)
            elif to == OPS:
                ok = module == DEPLOY or module.startswith(DEPLOY + ".")
            else:
                ok = to != BENCH and to <= rank
            if not ok:
                upward.append(f"{module} (layer {rank}) imports {target} (layer {to})")
    assert not upward, "imports against the layers:\n" + "\n".join(sorted(upward))


def test_no_import_circles():
    graph = _graph()
    # Package __init__ files are entry points that re-export their folder; a submodule reaching its own
    # package's __init__ is Python's doing, not a circle of ours.
    edges = {m: {t for t in ts if not (m.startswith(t + "."))} for m, ts in graph.items()}
    state: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                circles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


@pytest.mark.parametrize("module", ["tally.errors", "tally.bench.client", "tally.core.kv_manager"])
def test_the_checker_sees_the_modules_it_judges(module):
    assert module in _graph()
