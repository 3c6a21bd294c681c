"""Packaging: every package Tally imports is declared (base install or an extra), torch only with the `serve`
extra, `tally plan` and `tally bench` run where torch cannot be imported, and every declared package has the exact
version `make` installs in constraints.txt."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
PRESET = "Llama-3.1-8B"
SERVE_ONLY = ("torch", "transformers", "fastapi", "safetensors", "llguidance")


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _declared() -> dict[str, set[str]]:
    """distribution -> the groups (base, or extra names) that declare it."""
    groups = {"base": PROJECT["dependencies"], **PROJECT["optional-dependencies"]}
    out: dict[str, set[str]] = {}
    for group, requirements in groups.items():
        for r in requirements:
            if not r.startswith("tally["):
                out.setdefault(_name(r), set()).add(group)
    return out


def _imported_modules() -> set[str]:
    modules = set()
    for path in (ROOT / "tally").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    return modules - set(sys.stdlib_module_names) - {"tally", "__future__"}


def test_every_imported_package_is_declared():
    owners = packages_distributions()
    declared = _declared()
    for module in sorted(_imported_modules()):
        dists = {d.lower().replace("_", "-") for d in owners.get(module, [module])}
        assert dists & set(declared), f"tally imports {module} ({dists}) but pyproject.toml does not declare it"


def test_the_engine_comes_only_with_the_serve_extra():
    declared = _declared()
    for dist in SERVE_ONLY:
        assert declared.get(dist) == {"serve"}, (dist, declared.get(dist))


def test_every_declared_package_has_its_exact_version_in_constraints():
    pinned = {_name(line) for line in (ROOT / "constraints.txt").read_text().splitlines()
              if line and not line.startswith("#") and "==" in line}
    assert set(_declared()) <= pinned, set(_declared()) - pinned


BLOCK_ENGINE = """
import importlib.abc, sys
class NoEngine(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the test)")
sys.meta_path.insert(0, NoEngine())
from tally.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_plan_and_bench_run_without_the_engines_packages(tmp_path):
    script = BLOCK_ENGINE.format(blocked=set(SERVE_ONLY))
    plan = subprocess.run([sys.executable, "-c", script, "plan", "--model", PRESET, "--device", "a10"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert plan.returncode == 0, plan.stderr
    bench = subprocess.run([sys.executable, "-c", script, "bench", "--help"], capture_output=True, text=True,
                           cwd=ROOT, timeout=120)
    assert bench.returncode == 0 and "--concurrency" in bench.stdout, bench.stderr
    serve = subprocess.run([sys.executable, "-c", script, "serve", "--help"], capture_output=True, text=True,
                           cwd=ROOT, timeout=120)
    assert serve.returncode == 2 and "not available in this build" in serve.stderr


def test_the_native_kernels_sources_ship_in_the_package():
    """An installed (not editable) Tally compiles its kernels from the files tally/native/library.py reads; each must
    match a package-data pattern, or there the kernels would fail to build and every path fall back to PyTorch."""
    from fnmatch import fnmatch

    from tally.native import library

    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["tally"]
    for path in [library.SOURCE, *library.HEADERS]:
        relative = path.relative_to(ROOT / "tally").as_posix()
        assert any(fnmatch(relative, p) for p in patterns), relative
