"""The gate: baseline, then candidate, through the same workload with the same decoding; the verdicts."""
from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from tally.quality.model_run import ModelSpec, open_model, run_model, same_vocabulary
from tally.quality.settings import VERDICTS, EvalSettings
from tally.quality.suites import build_workload
from tally.quality.verdicts import SuiteResult, WorstCase, compare_runs, overall_verdict

log = logging.getLogger(__name__)


@dataclass
class GateReport:
    baseline: ModelSpec
    candidate: ModelSpec
    settings: EvalSettings
    max_model_len: int
    results: list[SuiteResult]
    worst: list[WorstCase]
    skipped: list[str]  # items too long for max_model_len, left out for both models
    overall: str  # pass | warn | fail
    fail_on: str  # the verdict from which the gate says no-go
    timings_s: dict[str, float] = field(default_factory=dict)

    @property
    def go(self) -> bool:
        return VERDICTS.index(self.overall) < VERDICTS.index(self.fail_on)


def _load(spec: ModelSpec, settings: EvalSettings, progress: bool) -> tuple[Any, float]:
    t0 = time.perf_counter()
    llm = open_model(spec, settings.decoding, progress)
    load_s = time.perf_counter() - t0
    log.info("loaded %s in %.0f s", spec.label(), load_s)
    return llm, load_s


def run_gate(baseline: ModelSpec, candidate: ModelSpec, settings: EvalSettings, fail_on: str = "fail",
             progress: bool = True) -> GateReport:
    s = settings
    llm, base_load_s = _load(baseline, s, progress)
    tok, max_len = llm.get_tokenizer(), llm.engine.max_model_len
    workload = build_workload(tok, max_len, s.suites, s.ppl_tokens, s.ppl_window_tokens, s.decoding.max_tokens,
                              s.limit)
    log.info("workload: %d perplexity windows, %d items (%d skipped as too long)",
             sum(map(len, workload.ppl_windows.values())), len(workload.items), len(workload.skipped))
    base = run_model(llm, baseline, workload, s.decoding, progress)
    log.info("baseline ran in %.0f s", base.run_s)
    del llm
    gc.collect()  # one model in memory at a time
    llm, cand_load_s = _load(candidate, s, progress)
    same_vocabulary(tok, llm.get_tokenizer())
    cand = run_model(llm, candidate, workload, s.decoding, progress)
    log.info("candidate ran in %.0f s", cand.run_s)
    del llm
    gc.collect()
    results, worst = compare_runs(workload.items, base, cand, s)
    timings = {"baseline_load_s": base_load_s, "baseline_run_s": base.run_s,
               "candidate_load_s": cand_load_s, "candidate_run_s": cand.run_s}
    return GateReport(baseline, candidate, s, max_len, results, worst, workload.skipped,
                      overall_verdict(results), fail_on, timings)
