"""`--step-log FILE`: one JSON line per engine step, for finding where a stream's long gap came from (a long step, a
step it sat out, or the way back to the client); `benchmarks/itl_under_trace.py --attribute` joins it with a bench
run's token times. Times are on the host's monotonic clock (time.perf_counter), which every process shares."""
from __future__ import annotations

import json
from typing import TextIO

from tally.core.scheduler import SchedulerOutput


class StepLog:
    def __init__(self, path: str) -> None:
        self._file: TextIO = open(path, "a", buffering=1, encoding="utf-8")  # a line at a time: readable mid-run

    def write(self, start_s: float, seconds: float, out: SchedulerOutput, chunks: list[tuple[int, int]],
              token_budget: int | None, predicted_s: float | None, num_waiting: int, proposals: int = 0,
              proposing_s: float = 0.0, sliced: dict | None = None) -> None:
        """One step: `chunks` its prompt chunks (step_stats.prompt_chunks), `predicted_s` what the step cost fit
        said it would take before it ran (None before a fit, or without prompt tokens), and with speculation the
        proposals it verified and the seconds spent finding and choosing them (what the adaptive policy prices);
        `sliced`, a held prompt pass's slice run after the step's decodes: its tokens, [first, end) layers, and of
        how many."""
        self._file.write(json.dumps({
            "start_s": round(start_s, 6), "seconds": round(seconds, 6),
            "prompt_tokens": sum(n for n, _ in chunks), "chunks": [list(c) for c in chunks],
            # a one-token prompt chunk counts as a decode row here, as it does in the step cost's fit
            "rows": len(out.scheduled), "decode_rows": len(out.scheduled) - len(chunks),
            "preempted": len(out.preempted), "waiting": num_waiting, "token_budget": token_budget,
            "predicted_s": None if predicted_s is None else round(predicted_s, 6), "proposals": proposals,
            "proposing_s": round(proposing_s, 6), "slice": sliced}) + "\n")

    def close(self) -> None:
        self._file.close()
