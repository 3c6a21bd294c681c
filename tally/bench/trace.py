"""Request logs as workloads: CSV or JSONL rows with prompt/output token counts and, optionally,
arrival timestamps (the Azure LLM 2023 traces ship with Tally; see data/TRACES_LICENSE.md)."""
from __future__ import annotations

import csv
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
# Column names seen in public traces and serving logs, compared case-insensitively.
_PROMPT_KEYS = ("contexttokens", "prompt_tokens", "input_tokens", "prompt_len", "input_len",
                "prompt_length", "input_length", "num_prompt_tokens")
_OUTPUT_KEYS = ("generatedtokens", "output_tokens", "completion_tokens", "generated_tokens",
                "output_len", "output_length", "num_output_tokens")
_TIME_KEYS = ("timestamp", "arrival_time", "arrival_s", "time", "created", "t")


@dataclass(frozen=True)
class Trace:
    source: str
    prompt_tokens: np.ndarray  # int64, one per request
    output_tokens: np.ndarray  # int64
    arrival_s: np.ndarray | None  # float64 seconds since the first request, sorted; None if absent

    def __len__(self) -> int:
        return len(self.prompt_tokens)


def resolve_trace_path(name: str) -> Path:
    """A file path, or one of the shipped trace names (`conv`, `code`)."""
    path = SHIPPED_TRACES.get(name.lower(), Path(name))
    if not path.is_file():
        raise ConfigError(f"trace {name!r} is not a file; give a CSV/JSONL path or one of "
                          f"{sorted(SHIPPED_TRACES)}")
    return path


def _flatten(row: dict) -> dict[str, object]:
    flat: dict[str, object] = {}
    for key, value in row.items():
        if isinstance(value, dict):  # e.g. an OpenAI-style {"usage": {"prompt_tokens": ...}}
            flat.update({k.lower(): v for k, v in value.items()})
        else:
            flat[str(key).strip().lower()] = value
    return flat


def _read_rows(path: Path) -> list[dict[str, object]]:
    with path.open(newline="") as handle:
        first = handle.read(1)
        handle.seek(0)
        if first in ("{", "["):
            text = handle.read()
            rows = json.loads(text) if first == "[" else [
                json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            rows = list(csv.DictReader(handle))
    return [_flatten(row) for row in rows]


def _pick(columns: set[str], keys: tuple[str, ...]) -> str | None:
    return next((key for key in keys if key in columns), None)


def _seconds(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except ValueError:
        return datetime.fromisoformat(str(value).strip()).timestamp()


def load_trace(name: str) -> Trace:
    path = resolve_trace_path(name)
    rows = _read_rows(path)
    if not rows:
        raise ConfigError(f"trace {path} has no rows")
    columns = set(rows[0])
    prompt_key, output_key = _pick(columns, _PROMPT_KEYS), _pick(columns, _OUTPUT_KEYS)
    if prompt_key is None or output_key is None:
        raise ConfigError(f"trace {path} needs a prompt-token column (one of {_PROMPT_KEYS}) and an "
                          f"output-token column (one of {_OUTPUT_KEYS}); it has {sorted(columns)}")
    time_key = _pick(columns, _TIME_KEYS)
    try:
        prompt = np.array([int(float(row[prompt_key])) for row in rows], dtype=np.int64)
        output = np.array([int(float(row[output_key])) for row in rows], dtype=np.int64)
        times = None if time_key is None else np.array([_seconds(row[time_key]) for row in rows])
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"trace {path}: a row has an unreadable number or timestamp ({exc})") from None
    if times is not None:
        order = np.argsort(times, kind="stable")
        prompt, output, times = prompt[order], output[order], times[order] - times[order][0]
    return Trace(str(path), prompt, output, times)
