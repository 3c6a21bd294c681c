"""One model through the user's suites, each item's result appended to a results file (JSONL) as soon as it is
scored: a run stopped by Ctrl-C or a crash keeps what it scored, and `--resume` goes on from there."""
from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tally.errors import ConfigError, clip
from tally.quality.answers import AnswerSource
from tally.quality.scorer_params import ItemScore
from tally.quality.scorers import safe_score
from tally.quality.suite_file import SuiteFile, SuiteItem
from tally.version import __version__

log = logging.getLogger("tally.quality")
ANSWER_CHARS = 4000  # kept per item in the results file


@dataclass(frozen=True)
class ItemResult:
    key: str  # suite/id: the same item in both models' results
    suite: str
    id: str
    line: int
    tags: tuple[str, ...]
    scorer: str
    score: float
    metrics: dict[str, float]  # metric name -> this item's value (see metrics_of)
    reason: str | None  # why the score is below 1, when known
    answer: str
    output_tokens: int | None

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> ItemResult:
        return cls(**{**{k: row[k] for k in cls.__dataclass_fields__}, "tags": tuple(row["tags"])})


def metrics_of(item: SuiteItem, scored: ItemScore) -> dict[str, float]:
    """`all` (every item), the scorer's own name, and for json_fields one `json_fields.NAME` per expected field."""
    out = {"all": scored.score, item.kind: scored.score}
    if item.kind == "json_fields":
        out |= {f"json_fields.{name}": scored.fields.get(name, 0.0) for name in item.scorer_spec["fields"]}
    return out


def _comparable(header: dict[str, Any]) -> dict[str, Any]:
    """A suite is the same by its bytes and decoding, wherever its file now lies."""
    return {"model": header.get("model"), "suites": [{**s, "path": None} for s in header.get("suites", [])]}


class RunFile:
    """The results file: a header line (the model, the suites with their hashes and decoding), then one line per
    scored item."""

    def __init__(self, path: Path, header: dict[str, Any], resume: bool) -> None:
        self.path, self.done = path, {}
        if resume and path.exists():
            self._read(header)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"header": header}, ensure_ascii=False) + "\n")
        self._file = path.open("a", encoding="utf-8")

    def _read(self, header: dict[str, Any]) -> None:
        lines = self.path.read_text(encoding="utf-8").splitlines()
        try:
            written = json.loads(lines[0])["header"]
        except (IndexError, ValueError, KeyError, TypeError):
            written = {}  # not a results file of ours: the check below says so
        for what, other in (("model", "a different model"), ("suites", "different suites or decoding")):
            if _comparable(written)[what] != _comparable(header)[what]:
                raise ConfigError(f"--resume: {self.path} holds results of {other} "
                                  f"({clip(json.dumps(written.get(what)), 300)}); drop --resume to start over, or "
                                  "use another --results folder")
        for line in lines[1:]:
            try:
                result = ItemResult.from_json(json.loads(line))
            except (ValueError, KeyError, TypeError):
                continue  # the line a crash cut short
            self.done[result.key] = result

    def append(self, result: ItemResult) -> None:
        self._file.write(json.dumps(asdict(result), ensure_ascii=False) + "\n")
        self._file.flush()
        self.done[result.key] = result

    def close(self) -> None:
        self._file.close()


def header(source: AnswerSource, suites: list[SuiteFile]) -> dict[str, Any]:
    return {"model": source.describe(), "suites": [s.describe() for s in suites], "tally_version": __version__}


def run_suites(source: AnswerSource, suites: list[SuiteFile], run_file: RunFile, batch_size: int,
               name: str) -> list[ItemResult]:
    """Every item not yet in `run_file`, a batch at a time; returns all items' results in suite order."""
    items = [it for s in suites for it in s.items]
    todo = [it for it in items if it.key not in run_file.done]
    if len(todo) < len(items):
        log.info("%s: %d of %d items already in %s", name, len(items) - len(todo), len(items), run_file.path)
    for start in range(0, len(todo), batch_size):
        batch = todo[start:start + batch_size]
        for item, answer in zip(batch, source.answer(batch)):
            if answer.error is None:
                scored = safe_score(item.scorer, answer.text, item.prompt)
            else:
                scored = ItemScore(0.0, reason=f"no answer: {answer.error}")
            run_file.append(ItemResult(item.key, item.suite, item.id, item.line, item.tags, item.kind, scored.score,
                                       metrics_of(item, scored), scored.reason, answer.text[:ANSWER_CHARS],
                                       answer.output_tokens))
        log.info("%s: %d of %d items scored", name, min(start + batch_size, len(todo)), len(todo))
    return [run_file.done[it.key] for it in items]
