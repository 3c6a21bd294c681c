"""The benchmarks page cannot drift from the scripts: every `python benchmarks/X.py ...` command in the docs names a
script that exists and only flags its argument parser defines, docs/benchmarks.md has the agreed `##` sections in
order and stays short, every `docs/benchmarks.md#<slug>` pointer in the repository names one of its headings, and
every script imports (a name one script takes from another still exists)."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "benchmarks.md"
MAX_LINES = 420
SECTIONS = ["Reading this page", "Peers: decode and prefill", "Serving", "Offline throughput", "Decode roofline",
            "Kernels", "Attention", "Paths chosen by measurement", "Sampler", "KV cache", "Speculative decoding",
            "Latency under load", "Structured outputs", "Quantization", "Parallel", "Reliability",
            "Tried and not kept", "Not measured yet"]
POINTER_ROOTS = ["tally", "benchmarks", "tests", "docs", "README.md"]
POINTER_SUFFIXES = {".py", ".c", ".h", ".md", ".txt", ".toml", ".yaml", ".yml", ".sh"}
COMMAND = re.compile(r"python3? benchmarks/(\w+)\.py")
POINTER = re.compile(r"benchmarks\.md#([\w-]+)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation but - and _ dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: str) -> set[str]:
    """Every heading's anchor, a repeated one numbered as GitHub numbers it (slug, slug-1, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"(?m)^#{1,6}\s+(.+?)\s*#*$", _outside_fences(page)):
        base = slug(heading)
        found.add(f"{base}-{seen[base]}" if base in seen else base)
        seen[base] = seen.get(base, 0) + 1
    return found


def _outside_fences(text: str) -> str:
    return re.sub(r"(?ms)^```.*?^```[^\n]*$", "", text)


def _option_strings(tree: ast.AST) -> set[str]:
    return {a.value for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument"
            for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("-")}


def _builds_a_parser(function: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", None)) == "ArgumentParser"
               for n in ast.walk(function))


@cache
def _tree(module: str) -> ast.Module:
    return ast.parse((ROOT / "benchmarks" / f"{module}.py").read_text())


@cache
def _shared_options(module: str) -> frozenset[str]:
    """Options a benchmarks/ module adds to a parser it is handed (in a function that builds none of its own)."""
    return frozenset(o for f in ast.walk(_tree(module)) if isinstance(f, ast.FunctionDef) and not _builds_a_parser(f)
                     for o in _option_strings(f))


def options_of(script: str) -> frozenset[str]:
    """The option strings `benchmarks/<script>.py` defines, with those that benchmarks/ modules it imports add to
    its parser."""
    tree = _tree(script)
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module} | \
        {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    shared = {o for m in imported if (ROOT / "benchmarks" / f"{m}.py").is_file() for o in _shared_options(m)}
    return frozenset(_option_strings(tree) | shared | {"-h", "--help"})


def commands(doc: str) -> list[tuple[str, str]]:
    """(script, its arguments) for each benchmarks command: inside a code span the arguments run to its end (a span
    may wrap), in a fenced block to the end of the line (or a continued line), in prose to the end of the line."""
    found = []
    for block in re.findall(r"(?ms)^```[^\n]*\n(.*?)^```", doc):
        for line in block.replace("\\\n", " ").splitlines():
            found += [(m[1], line[m.end():]) for m in COMMAND.finditer(line)]
    rest = _outside_fences(doc)
    for span in re.findall(r"`([^`]+)`", rest):
        found += [(m[1], span[m.end():]) for m in COMMAND.finditer(span)]
    for line in re.sub(r"`[^`]+`", "", rest).splitlines():
        found += [(m[1], line[m.end():]) for m in COMMAND.finditer(line)]
    return found


def command_problems(doc: str) -> list[str]:
    problems = []
    for script, args in commands(doc):
        if not (ROOT / "benchmarks" / f"{script}.py").is_file():
            problems.append(f"benchmarks/{script}.py does not exist")
            continue
        unquoted = re.sub(r"\"[^\"]*\"|'[^']*'", "", args)  # a quoted value may hold a peer's own flags
        for flag in re.findall(r"(?<![\w-])(--[A-Za-z][\w-]*)", unquoted):
            if flag not in options_of(script):
                problems.append(f"benchmarks/{script}.py has no {flag}")
    return problems


def pointer_problems(text: str, page: str) -> list[str]:
    known = anchors(page)
    return [f"no heading has the anchor #{name}" for name in POINTER.findall(text) if name not in known]


def _docs() -> dict[str, str]:
    paths = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
    return {str(p.relative_to(ROOT)): p.read_text() for p in paths}


def _pointer_files() -> list[Path]:
    files = []
    for name in POINTER_ROOTS:
        path = ROOT / name
        files += [path] if path.is_file() else [p for p in sorted(path.rglob("*"))
                                                  if p.is_file() and p.suffix in POINTER_SUFFIXES]
    return files


def test_every_benchmarks_command_in_the_docs_names_a_script_and_its_flags():
    problems = [f"{name}: {problem}" for name, text in _docs().items() for problem in command_problems(text)]
    assert problems == []


def test_the_benchmarks_page_has_the_agreed_sections_in_order():
    page = PAGE.read_text()
    assert re.findall(r"(?m)^## (.+?)\s*$", _outside_fences(page)) == SECTIONS


def test_the_benchmarks_page_stays_short():
    assert len(PAGE.read_text().splitlines()) <= MAX_LINES


def test_every_pointer_to_the_benchmarks_page_names_a_heading():
    page = PAGE.read_text()
    problems = [f"{path.relative_to(ROOT)}: {problem}" for path in _pointer_files()
                for problem in pointer_problems(path.read_text(errors="replace"), page)]
    assert problems == []


def test_the_sections_slugs_are_the_agreed_ones():
    assert [slug(s) for s in SECTIONS] == [
        "reading-this-page", "peers-decode-and-prefill", "serving", "offline-throughput", "decode-roofline",
        "kernels", "attention", "paths-chosen-by-measurement", "sampler", "kv-cache", "speculative-decoding",
        "latency-under-load", "structured-outputs", "quantization", "parallel", "reliability", "tried-and-not-kept",
        "not-measured-yet"]


def test_the_checks_catch_a_made_up_script_flag_and_section():
    page = PAGE.read_text()
    doc = ("`python benchmarks/no_such_script.py --threads 2` and `python benchmarks/decode_roofline.py --tokens 8\n"
           "--no-such-flag`, and `python benchmarks/speculative.py --arms \"draft --not-ours\"`")
    assert command_problems(doc) == ["benchmarks/no_such_script.py does not exist",
                                     "benchmarks/decode_roofline.py has no --no-such-flag"]
    target = "docs/benchmarks.md"
    pointers = f"# see {target}#kv-cache and {target}#no-such-section"
    assert pointer_problems(pointers, page) == ["no heading has the anchor #no-such-section"]
    assert "--llama-bench-args" in options_of("llama_bench_compare")
    assert "--variants" not in options_of("llama_bench_compare")  # cpu_paths's own parser: not llama_bench_compare's


IMPORT_ALL = """
import importlib, pathlib, sys
sys.path.insert(0, "benchmarks")
for path in sorted(pathlib.Path("benchmarks").glob("*.py")):
    try:
        importlib.import_module(path.stem)
    except Exception as e:
        print(f"benchmarks/{path.name}: {type(e).__name__}: {e}")
"""


def test_every_benchmarks_script_imports():
    """Scripts run only by hand: one that imports a helper another script has since renamed fails only when someone
    next runs it. Importing each (their work is under `if __name__ == "__main__"`) in one fresh process catches that."""
    done = subprocess.run([sys.executable, "-c", IMPORT_ALL], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
