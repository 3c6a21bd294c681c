"""Which way the model's projections run, chosen by measuring the candidates on this CPU, not by a rule about its flags
(the same flags rank the paths differently on different CPUs: docs/benchmarks.md#paths-chosen-by-measurement)."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from tally.engine.config import EngineConfig, PathCandidate
from tally.layers.path_timing import ComputePath, PathTimes, ProjectionShape, time_path
from tally.models.loader import Checkpoint
from tally.models.projection_shapes import projection_shapes
from tally.native import ops as native
from tally.native.library import build_digest, build_name
from tally.platform import cache_dir, cpu_flags, cpu_model, has_fast_bf16

log = logging.getLogger(__name__)

ROWS = (1, 8, 32, 128, 512)  # decode (1, 8: a few streams), then prompt-chunk sizes
# bf16 takes rows only where it measured this much faster: a smaller win is within the measurement's noise, a coin
# flip that would then be cached (docs/benchmarks.md#paths-chosen-by-measurement).
BF16_MARGIN = 1.1
BUDGET_BYTES = 256 * 2**20  # weight copies per candidate at few rows: past most last-level caches
VERSION = 4  # bump when what is measured or how it is chosen changes: old cache entries are ignored
KEY_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16",
             "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")


@dataclass
class PathChoice:
    candidate: PathCandidate
    many_tokens_from: int | None = None  # rows from which native layers multiply in bf16
    times: dict[str, PathTimes] = field(default_factory=dict)  # by candidate label; empty: nothing measured
    seconds: float = 0.0  # the measurement's own cost (0 when read from the cache)
    cache_hit: bool = False

    @property
    def measured(self) -> bool:
        return bool(self.times)

    def summary(self) -> str:
        split = (f"; rows ≥ {self.many_tokens_from} in bf16 (weights dequantized per call)"
                 if self.many_tokens_from else "")
        if not self.measured:
            return f"{self.candidate.label}{split} (set by flags or checkpoint dtype, not measured)"
        how = "cached measurement" if self.cache_hit else f"measured in {self.seconds:.1f} s"
        build = build_name()
        kernels = f"; native {build} kernels" if build else ""
        return f"{self.candidate.label}{split}{kernels} ({how})"

    def table_lines(self) -> list[str]:
        """Tokens per second of the projections alone, per candidate and row count."""
        lines = ["rows: " + " ".join(f"{r:>8}" for r in ROWS)]
        for label, t in self.times.items():
            lines.append(f"{label}: " + " ".join(f"{r / t.own[r]:>8,.0f}" if r in t.own else f"{'-':>8}"
                                                 for r in ROWS))
            if t.bf16_many:
                lines.append(f"{label}, bf16 from per-call dequant: " + " ".join(
                    f"{r / t.bf16_many[r]:>8,.0f}" if r in t.bf16_many else f"{'-':>8}" for r in ROWS))
        return lines

    def to_dict(self) -> dict:
        return {"path": self.candidate.label, "summary": self.summary(), "dtype": self.candidate.dtype,
                "quantization": self.candidate.quantization, "many_tokens_from": self.many_tokens_from,
                "measured": self.measured, "cache_hit": self.cache_hit, "seconds": round(self.seconds, 3),
                "tokens_per_s": {label: {"own": {r: r / s for r, s in t.own.items()},
                                         "bf16_many": {r: r / s for r, s in (t.bf16_many or {}).items()}}
                                 for label, t in self.times.items()}}


def measured_path(config: EngineConfig, ckpt: Checkpoint, *, remeasure: bool = False) -> PathChoice:
    """The projection path for this checkpoint and config: fixed by flags, or measured here (and cached)."""
    candidates, open_choice = config.path_candidates(ckpt.config.torch_dtype, ckpt.format == "gguf",
                                                     ckpt.quantization is not None)
    if not open_choice:
        return PathChoice(candidates[0])
    shapes = {c.quantization or "": projection_shapes(ckpt.config, c.quantization, ckpt) for c in candidates}
    return choose_path(candidates, shapes, remeasure=remeasure)


def choose_path(candidates: list[PathCandidate], shapes: dict[str, list[ProjectionShape]], *,
                remeasure: bool = False) -> PathChoice:
    """When the dtype is open (EngineConfig.path_candidates gives more than one path, or a path whose layers can send
    many-row steps to bf16), each candidate is timed on the model's own projection shapes at ROWS
    (tally/layers/path_timing.py), at one row first and then, for the fastest there, at the other row counts.
    The path fastest at one row serves the model: decode steps are most steps and
    what TPOT feels, and the one-call native decode step lives on that side. Then, where that path's layers can
    multiply in bf16 over weights dequantized per call, rows from the first measured count at which that is clearly
    faster (BF16_MARGIN) for every larger count take it (prompt chunks; no second copy of the weights). The choice is
    cached on disk by (CPU model and flags, torch version, threads, shapes, candidates): a second start reads it;
    `tally tune` measures again.

    `shapes`: the model's projections as each candidate's quantization stores them (by quantization name,
    "" for dense)."""
    try_many = has_fast_bf16() and native.available()
    if len(candidates) == 1 and not (try_many and candidates[0].dtypes[0] == torch.float32):
        return PathChoice(candidates[0])
    key = _key(candidates, shapes)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    cache_file = cache_dir() / "paths" / f"{digest}.json"
    if not remeasure:
        cached = _read(cache_file, key, candidates)
        if cached is not None:
            return cached
    start = time.perf_counter()
    # one row for every candidate, then the other row counts for the winner only: the losers' many-row figures
    # would decide nothing, and a path slow at one row is slow to measure
    times = {c.label: time_path(shapes[c.quantization or ""], _compute_path(c), ROWS[:1], BUDGET_BYTES)
             for c in candidates}
    best = min(candidates, key=lambda c: times[c.label].own[1])
    rest = time_path(shapes[best.quantization or ""], _compute_path(best), ROWS[1:], BUDGET_BYTES,
                     try_bf16_many=try_many and best.dtypes[0] == torch.float32)
    times[best.label] = PathTimes({**times[best.label].own, **rest.own}, rest.bf16_many)
    choice = _decide(candidates, times)
    choice.seconds = time.perf_counter() - start
    _write(cache_file, key, choice)
    return choice


def _compute_path(c: PathCandidate) -> ComputePath:
    compute, weight = c.dtypes
    return ComputePath(compute, weight or compute)


def _decide(candidates: list[PathCandidate], times: dict[str, PathTimes]) -> PathChoice:
    best = min(candidates, key=lambda c: times[c.label].own[1])
    many = times[best.label].bf16_many
    start = None
    if many:
        for r in sorted(many, reverse=True):  # the smallest count from which bf16 wins at every larger one
            if many[r] * BF16_MARGIN > times[best.label].own[r]:
                break
            start = r
    return PathChoice(best, start, times)


def _key(candidates: list[PathCandidate], shapes: dict[str, list[ProjectionShape]]) -> dict:
    return {"version": VERSION, "cpu": cpu_model(), "flags": sorted(set(KEY_FLAGS) & cpu_flags()),
            "torch": torch.__version__, "threads": torch.get_num_threads(), "native": build_name(),
            "kernels": build_digest(),
            "candidates": [c.label for c in candidates],
            "shapes": {q: [asdict(s) for s in ss] for q, ss in sorted(shapes.items())}}


def _read(path: Path, key: dict, candidates: list[PathCandidate]) -> PathChoice | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if data.get("key") != key:
        return None  # a hash collision, or a file from elsewhere: measure
    by_label = {c.label: c for c in candidates}
    times = {label: PathTimes({int(r): s for r, s in t["own"].items()},
                              {int(r): s for r, s in t["bf16_many"].items()} if t["bf16_many"] else None)
             for label, t in data["times"].items()}
    return PathChoice(by_label[data["path"]], data["many_tokens_from"], times, 0.0, cache_hit=True)


def _write(path: Path, key: dict, choice: PathChoice) -> None:
    data = {"key": key, "path": choice.candidate.label, "many_tokens_from": choice.many_tokens_from,
            "times": {label: {"own": t.own, "bf16_many": t.bf16_many} for label, t in choice.times.items()}}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.partial")
        partial.write_text(json.dumps(data, indent=1))
        partial.replace(path)  # atomic: a concurrent start reads the old state or the whole file
    except OSError as exc:  # a read-only home still serves; it measures again next start
        log.warning("could not cache the measured path in %s: %s", path, exc)
