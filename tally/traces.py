"""Request logs as (prompt tokens, output tokens[, arrival time]) per request: the one reader behind
`tally plan --lengths` and `tally bench --lengths trace:... / --replay`.

It reads CSV, a JSON list, JSON Lines, a `tally bench` result document (its per-request records), vLLM's and
GuideLLM's benchmark results, or a directory of JSON Lines files (`tally serve --request-log DIR`), with
the column names seen in public traces and serving logs (compared case-insensitively; an OpenAI-style nested
`usage` object is flattened). Rows lacking a prompt or an output length are skipped (a failed request in a
result file has none). `conv` and `code` name the Azure LLM inference traces 2023 shipped in tally/data
(CC-BY 4.0, see tally/data/TRACES_LICENSE.md).
"""
from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from tally.errors import ConfigError

DATA_DIR = Path(__file__).parent / "data"
SHIPPED_TRACES = {
    "conv": DATA_DIR / "azure_llm_2023_conv.csv",
    "azure-conv": DATA_DIR / "azure_llm_2023_conv.csv",
    "code": DATA_DIR / "azure_llm_2023_code.csv",
    "azure-code": DATA_DIR / "azure_llm_2023_code.csv",
}
PROMPT_KEYS = ("contexttokens", "prompt_tokens", "input_tokens", "prompt_len", "input_len",
               "prompt_length", "input_length", "num_prompt_tokens")
OUTPUT_KEYS = ("generatedtokens", "output_tokens", "completion_tokens", "generated_tokens",
               "output_len", "output_length", "num_output_tokens")
TIME_KEYS = ("timestamp", "arrival_time", "arrival_s", "time", "created", "t")


@dataclass(frozen=True)
class Trace:
    source: str
    prompt_tokens: np.ndarray  # int64, one per request
    output_tokens: np.ndarray  # int64
    arrival_s: np.ndarray | None  # float64 seconds since the first request, sorted; None if absent

    def __len__(self) -> int:
        return len(self.prompt_tokens)

    def pairs(self) -> list[tuple[int, int]]:
        return list(zip(self.prompt_tokens.tolist(), self.output_tokens.tolist()))


def resolve_trace_path(name: str | Path) -> Path:
    """A file path, or one of the shipped trace names (`conv`, `code`)."""
    path = SHIPPED_TRACES.get(str(name).lower(), Path(name))
    if not (path.is_file() or path.is_dir()):
        raise ConfigError(f"no lengths file or trace at {str(name)!r}; give a CSV/JSONL trace, a `tally bench` result, or one of "
                          f"{sorted(SHIPPED_TRACES)}")
    return path


def load_trace(name: str | Path) -> Trace:
    path = resolve_trace_path(name)
    rows = [_flatten(r) for r in _records_at(path)]
    prompt, output, times = [], [], []
    try:
        for row in rows:
            p, o = _number(row, PROMPT_KEYS), _number(row, OUTPUT_KEYS)
            if p is None or o is None:
                continue
            prompt.append(int(p))
            output.append(int(o))
            times.append(_seconds(row, TIME_KEYS))
    except ValueError as exc:
        raise ConfigError(f"trace {path}: a row has an unreadable number or timestamp ({exc})") from None
    if not prompt:
        raise ConfigError(f"{path}: found no prompt/output lengths; expected columns such as "
                          "ContextTokens,GeneratedTokens or prompt_tokens,output_tokens")
    prompts, outputs = np.array(prompt, dtype=np.int64), np.array(output, dtype=np.int64)
    if any(t is None for t in times):
        return Trace(str(path), prompts, outputs, None)
    arrival = np.array(times, dtype=np.float64)
    order = np.argsort(arrival, kind="stable")
    return Trace(str(path), prompts[order], outputs[order], arrival[order] - arrival[order][0])


def json_lines(text: str) -> list[str]:
    """The records of a JSON Lines text, split at "\\n" only: str.splitlines() also splits at U+2028, U+0085 and
    the like, which a record may hold unescaped inside a string."""
    return [line for line in text.split("\n") if line.strip()]


def _records_at(path: Path) -> list[dict]:
    """A file's records, or those of every *.jsonl file in a directory (`tally serve --request-log DIR`)."""
    if path.is_dir():
        return [r for f in sorted(path.glob("*.jsonl")) for r in _records(f.read_text(encoding="utf-8"), f)]
    return _records(path.read_text(encoding="utf-8"), path)


def _records(text: str, path: Path) -> list[dict]:
    if path.suffix.lower() == ".csv" or not text.lstrip().startswith(("{", "[")):
        return list(csv.DictReader(io.StringIO(text, newline="")))  # the csv module finds the rows' ends itself
    try:
        document = json.loads(text)
    except json.JSONDecodeError:  # JSON Lines: one record per line
        return [json.loads(line) for line in json_lines(text)]
    return _records_in(document) or ([document] if isinstance(document, dict) else [])


def _records_in(document: object) -> list[dict]:
    """A JSON list of records, or the first list of records found in a result document (lists before nested
    objects, so a summary's token totals are not taken for a request); vLLM's benchmark results hold columns
    (`input_lens`, `output_lens`) instead of records."""
    if isinstance(document, dict) and isinstance(document.get("input_lens"), list) \
            and isinstance(document.get("output_lens"), list):
        return [{"prompt_tokens": p, "output_tokens": o} for p, o in zip(document["input_lens"],
                                                                         document["output_lens"])]
    if isinstance(document, list):
        records = [r for r in document if isinstance(r, dict)]
        if any(_is_request(r) for r in records):
            return records
        return [found for r in records for found in _records_in(r)]  # e.g. GuideLLM's list of benchmarks
    if isinstance(document, dict):
        for value in sorted(document.values(), key=lambda v: not isinstance(v, list)):
            found = _records_in(value)
            if any(_is_request(r) for r in found):
                return found
    return []


def _is_request(record: dict) -> bool:
    return _number(_flatten(record), PROMPT_KEYS) is not None


def _flatten(row: dict) -> dict[str, object]:
    flat: dict[str, object] = {}
    for key, value in row.items():
        if isinstance(value, dict):  # e.g. an OpenAI-style {"usage": {"prompt_tokens": ...}}
            flat.update({str(k).strip().lower(): v for k, v in value.items()})
        else:
            flat[str(key).strip().lower()] = value
    return flat


def _number(row: dict[str, object], keys: tuple[str, ...]) -> float | None:
    for key in keys:
        value = row.get(key)
        if value not in (None, ""):
            return float(value)  # type: ignore[arg-type]
    return None


def _seconds(row: dict[str, object], keys: tuple[str, ...]) -> float | None:
    value = next((row[k] for k in keys if row.get(k) not in (None, "")), None)
    if value is None:
        return None
    try:
        return float(value)  # type: ignore[arg-type]
    except ValueError:
        return datetime.fromisoformat(str(value).strip()).timestamp()
