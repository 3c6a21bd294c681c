"""docs/architecture.md stays true to the code: every file it names exists, and every class, function, method
or attribute it names is defined where it says (or, named alone, somewhere in tally/)."""
from __future__ import annotations

import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
PATH = r"tally/[\w/]*\w\.(?:py|c|txt)|tally/[\w/]*\w/"
IDENT = r"[A-Za-z_]\w*"


@cache
def _sources() -> dict[Path, str]:
    return {p: p.read_text() for p in (ROOT / "tally").rglob("*.py")}


def _defines(text: str, name: str) -> bool:
    """A def, class, assignment, annotated field or attribute of `name` in `text`."""
    pattern = (rf"(?m)^\s*(?:async\s+)?(?:def|class)\s+{name}\b|^\s*{name}\s*[:=]|\bself\.{name}\s*[:=]"
               rf"|\"{name}\"")
    return re.search(pattern, text) is not None


def _class_file(name: str) -> Path | None:
    return next((p for p, text in _sources().items() if re.search(rf"(?m)^class\s+{name}\b", text)), None)


def _problems(doc: str) -> list[str]:
    problems = []
    for path in set(re.findall(PATH, doc)):
        if not (ROOT / path).exists():
            problems.append(f"{path} does not exist")
    for path, dotted in re.findall(rf"({PATH}):({IDENT}(?:\.{IDENT})*)", doc):
        text = (ROOT / path).read_text() if (ROOT / path).is_file() else ""
        for name in dotted.split("."):
            if not _defines(text, name):
                problems.append(f"{path} defines no {name}")
    for owner, member in re.findall(rf"`?\b([A-Z]\w+)\.({IDENT})\b", doc):
        where = _class_file(owner)
        if where is None:
            problems.append(f"no class {owner} in tally/")
        elif not _defines(_sources()[where], member):
            problems.append(f"{owner} ({where.relative_to(ROOT)}) has no {member}")
    for name in re.findall(rf"`({IDENT})(?:\(\))?`", doc):
        if "_" in name or name[0].isupper():  # code names, not words
            if not any(_defines(text, name) for text in _sources().values()):
                problems.append(f"{name} is defined nowhere in tally/")
    return problems


def test_every_name_in_the_architecture_doc_exists():
    assert _problems(DOC.read_text()) == []


def test_the_check_catches_a_stale_name():
    stale = "`tally/engine/cpu.py`, `Engine.run_forever()`, `tally/core/scheduler.py:Planner`, `make_widget`"
    assert len(_problems(stale)) == 4
