"""A user's suite file (JSONL), read and checked whole before any model runs: one item per line — a `prompt` or
`messages`, a `scorer`, optional `tags` and `id` — and optionally a first line `{"decoding": {...}}`. Every error
names the file, the line and the field."""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tally.errors import ConfigError, echo
from tally.quality.scorers import Scorer, parse_scorer

ITEM_KEYS = ("id", "prompt", "messages", "scorer", "tags")
ROLES = ("system", "user", "assistant")
_TAG = re.compile(r"^[\w.-]+$")
MAX_TOKENS_LIMIT = 1 << 20


@dataclass(frozen=True)
class SuiteDecoding:
    """How every item of a suite is decoded: greedy unless its file says otherwise. Recorded with the results."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 64
    seed: int = 0  # sampled decoding only: item i of the suite gets seed + a hash of its id

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class SuiteItem:
    suite: str  # the file's stem
    line: int
    id: str
    prompt: str | None
    messages: tuple[dict[str, str], ...] | None
    scorer_spec: dict[str, Any]  # as written, for the results file
    scorer: Scorer
    tags: tuple[str, ...]
    decoding: SuiteDecoding

    @property
    def key(self) -> str:
        return f"{self.suite}/{self.id}"

    @property
    def kind(self) -> str:
        return self.scorer_spec["type"]


@dataclass(frozen=True)
class SuiteFile:
    path: Path
    sha256: str  # of the file's bytes: the results record which suite they answer
    decoding: SuiteDecoding
    items: tuple[SuiteItem, ...]

    def describe(self) -> dict[str, Any]:
        return {"path": str(self.path), "sha256": self.sha256, "items": len(self.items),
                "decoding": asdict(self.decoding)}


def _decoding(raw: object, where: str, max_tokens: int) -> SuiteDecoding:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: field decoding must be an object, e.g. {{\"temperature\": 0}}")
    known = ("temperature", "top_p", "max_tokens", "seed")
    for name, value in raw.items():
        if name not in known:
            raise ConfigError(f"{where}: field decoding.{name} is not a decoding setting; known: {', '.join(known)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: field decoding.{name} must be a number, got {echo(value)}")
    d = SuiteDecoding(float(raw.get("temperature", 0.0)), float(raw.get("top_p", 1.0)),
                      raw.get("max_tokens", max_tokens), raw.get("seed", 0))
    if not 0 <= d.temperature <= 2 or not 0 < d.top_p <= 1:
        raise ConfigError(f"{where}: field decoding: temperature must be in [0, 2] and top_p in (0, 1]")
    if not isinstance(d.max_tokens, int) or not 1 <= d.max_tokens <= MAX_TOKENS_LIMIT or not isinstance(d.seed, int):
        raise ConfigError(f"{where}: field decoding: max_tokens must be a whole number ≥ 1 and seed a whole number")
    return d


def _messages(raw: object, where: str) -> tuple[dict[str, str], ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{where}: field messages must be a non-empty list of {{\"role\", \"content\"}} objects")
    for i, m in enumerate(raw):
        if (not isinstance(m, dict) or set(m) != {"role", "content"} or m["role"] not in ROLES
                or not isinstance(m["content"], str)):
            raise ConfigError(f"{where}: field messages[{i}] must be {{\"role\": {'|'.join(ROLES)}, "
                              f"\"content\": TEXT}}, got {echo(m)}")
    return tuple(raw)


def _tags(raw: object, where: str) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(t, str) and _TAG.match(t) for t in raw):
        raise ConfigError(f"{where}: field tags must be a list of words (letters, digits, _ . -), got {echo(raw)}")
    if "all" in raw:
        raise ConfigError(f"{where}: field tags: 'all' is reserved for every item of the eval")
    return tuple(dict.fromkeys(raw))


def _item(row: object, suite: str, line: int, where: str, decoding: SuiteDecoding) -> SuiteItem:
    if not isinstance(row, dict):
        raise ConfigError(f"{where}: a line must be a JSON object (an item), got {echo(row)}")
    unknown = sorted(set(row) - set(ITEM_KEYS))
    if unknown:
        raise ConfigError(f"{where}: field {unknown[0]} is not an item field; known: {', '.join(ITEM_KEYS)}")
    if ("prompt" in row) == ("messages" in row):
        raise ConfigError(f"{where}: an item has exactly one of prompt (text) or messages (a chat)")
    prompt, messages = row.get("prompt"), None
    if "prompt" in row and (not isinstance(prompt, str) or not prompt):
        raise ConfigError(f"{where}: field prompt must be a non-empty string, got {echo(prompt)}")
    if "messages" in row:
        messages = _messages(row["messages"], where)
    scorer = parse_scorer(row.get("scorer"), where)
    if row["scorer"].get("with_prompt") and prompt is None:
        raise ConfigError(f"{where}: field scorer.with_prompt puts the prompt before the answer; it needs a prompt "
                          "item, not messages")
    item_id = row.get("id", str(line))
    if not isinstance(item_id, (str, int)) or isinstance(item_id, bool) or str(item_id) == "":
        raise ConfigError(f"{where}: field id must be a string or a number, got {echo(item_id)}")
    return SuiteItem(suite, line, str(item_id), prompt, messages, row["scorer"], scorer,
                     _tags(row.get("tags", []), where), decoding)


def read_suite(path: Path, max_tokens: int) -> SuiteFile:
    """`max_tokens`: the default where the file's decoding line sets none."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"--suite {path}: cannot read it ({e.strerror})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"--suite {path}: not UTF-8 text (byte {e.start})") from None
    decoding, items, seen = SuiteDecoding(max_tokens=max_tokens), [], {}
    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{line_no}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{where}: not a JSON object ({e.msg} at column {e.colno})") from None
        if isinstance(row, dict) and "decoding" in row:
            if items or set(row) != {"decoding"}:
                raise ConfigError(f"{where}: field decoding belongs on a line of its own, before the first item")
            decoding = _decoding(row["decoding"], where, max_tokens)
            continue
        item = _item(row, path.stem, line_no, where, decoding)
        if item.id in seen:
            raise ConfigError(f"{where}: field id {item.id!r} is already the id of line {seen[item.id]}")
        seen[item.id] = line_no
        items.append(item)
    if not items:
        raise ConfigError(f"--suite {path}: holds no item; write one JSON object per line (docs/quality.md)")
    return SuiteFile(path, hashlib.sha256(data).hexdigest(), decoding, tuple(items))


def read_suites(paths: list[Path], max_tokens: int) -> list[SuiteFile]:
    suites = [read_suite(p, max_tokens) for p in paths]
    stems = [s.path.stem for s in suites]
    clash = next((s for s in stems if stems.count(s) > 1), None)
    if clash:
        raise ConfigError(f"--suite: two suite files are named {clash!r}; results are keyed by the file's name, "
                          "rename one")
    return suites
