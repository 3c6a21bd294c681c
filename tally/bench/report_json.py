"""The JSON result: self-describing (command, server, workload, definitions), the summary, and
every per-request record, so any figure can be recomputed later. A run stopped early (Ctrl-C,
--time-limit) gives the same result for what finished, with `partial: true` and `stopped`."""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tally.bench.arrivals import WARMUP, Phase
from tally.bench.client import RequestRecord
from tally.bench.prompts import PromptBuilder
from tally.bench.server_info import ServerInfo
from tally.bench.soak import SoakSample, verdict
from tally.bench.stats import DEFINITIONS, Slo, phase_breakdown, summarize
from tally.bench.tokenizer import Tokenizer
from tally.bench.wording import causes_words
from tally.bench.workload import WorkloadConfig
from tally.errors import ConfigError
from tally.metric_names import (
    REQUEST_QUEUE_TIME_SECONDS,
    SPEC_DECODE_NUM_ACCEPTED_TOKENS,
    SPEC_DECODE_NUM_DRAFT_TOKENS,
    SPEC_DECODE_NUM_DRAFTS,
    TIME_TO_FIRST_TOKEN_SECONDS,
)
from tally.prometheus_text import Exposition, counter_increase, histogram_delta

SCHEMA = "tally.bench/1"
# Send lateness P99 above both of these means the figures include the client's own delay.
LATE_WARN_S = 0.010
LATE_WARN_FRACTION_OF_TTFT = 0.05


@dataclass(frozen=True)
class RunOutcome:
    command: list[str]
    started_at: float  # epoch seconds
    server: ServerInfo
    tokenizer: Tokenizer
    builder: PromptBuilder
    workload: WorkloadConfig
    records: list[RequestRecord]
    phases: list[Phase]
    metrics_before: Exposition | None
    metrics_after: Exposition | None
    soak_samples: list[SoakSample] | None
    stopped: dict | None = None  # why and when a run stopped early, and what it left; None: ran to its end
    clock_origin_s: float | None = None  # time.perf_counter() at the run's time zero (the host's monotonic clock)


def _record_dict(record: RequestRecord) -> dict:
    out = asdict(record)
    for key in ("scheduled_s", "sent_s", "first_token_s", "last_token_s", "end_s"):
        out[key] = None if out[key] is None else round(out[key], 6)
    out["itl_s"] = [round(x, 6) for x in record.itl_s]
    return out


def partial_line(stopped: dict) -> str:
    """One sentence on a run that stopped early, for every report."""
    not_sent = (f", {stopped['not_sent']} scheduled requests never sent"
                if stopped.get("not_sent") else "")
    return (f"partial run: {stopped['detail']} at {stopped['at_s']:.1f}s; {stopped['sent']} requests "
            f"sent, {stopped['finished']} finished, {stopped['cancelled']} cancelled in flight "
            f"(grace period {stopped['grace_s']:g}s){not_sent}. The figures cover what finished.")


def _warnings(summary: dict, run: RunOutcome) -> list[str]:
    warnings = [partial_line(run.stopped)] if run.stopped else []
    late, ttft_p50_s = summary["lateness_s"], summary["ttft_s"].get("p50", 0.0)
    if late.get("count") and late["p99"] > max(LATE_WARN_S, LATE_WARN_FRACTION_OF_TTFT * ttft_p50_s):
        warnings.append(f"the client fell behind its schedule: send lateness P99 "
                        f"{late['p99'] * 1e3:.1f} ms, max {late['max'] * 1e3:.1f} ms; these figures "
                        f"include the client's own delay (lower the rate or move the client)")
    if not run.tokenizer.exact:
        warnings.append(f"prompt lengths are approximate: {run.tokenizer.source}; pass "
                        f"--tokenizer PATH/tokenizer.json for exact counts")
    mismatched = sum(r.ok and r.prompt_tokens != r.expected_prompt_tokens for r in run.records)
    if mismatched and run.tokenizer.exact and run.server.endpoint == "completions":
        warnings.append(f"{mismatched} requests reached the server with another prompt token count "
                        f"than planned (see expected_prompt_tokens in the records)")
    if run.builder.inexact_prompts:
        warnings.append(f"{run.builder.inexact_prompts} prompts could not be cut to their exact "
                        f"token count (the closest count was used)")
    if run.server.probe_status != 200:
        warnings.append(f"the 1-token test request got HTTP {run.server.probe_status}; ignore_eos "
                        f"support was not verified")
    if not run.server.ignore_eos:
        warnings.append("the server rejected ignore_eos: output lengths are upper bounds (max_tokens)")
    if summary["counts"]["failed"]:
        warnings.append(f"{summary['counts']['failed']} requests failed: {causes_words(summary['errors'])}")
    return warnings


def build_result(run: RunOutcome, slo: Slo | None, timeout_s: float) -> dict:
    measured = [r for r in run.records if not r.warmup]
    measured_phases = [p for p in run.phases if p.name != WARMUP]
    summary = summarize(measured, measured_phases[0].start_s if measured_phases else 0.0, None, slo)
    before, after = run.metrics_before, run.metrics_after
    return {
        "schema": SCHEMA,
        "command": run.command,
        "partial": run.stopped is not None,
        "stopped": run.stopped,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(run.started_at)),
        # to join the records' times with a server's own log of the same clock on this host (tally serve --step-log)
        "clock_origin_s": run.clock_origin_s,
        "server": {**asdict(run.server), "tokenizer": run.tokenizer.source,
                   "tokenizer_exact": run.tokenizer.exact, "metrics_available": after is not None},
        "workload": {**run.workload.describe(), "endpoint": run.server.endpoint,
                     "timeout_s": timeout_s, "system_prompt_tokens_actual": run.builder.system_tokens},
        "definitions": DEFINITIONS,
        "summary": summary,
        "phases": phase_breakdown(run.records, run.phases, slo),
        "server_metrics": None if after is None else {
            key: histogram_delta(before, after, name)
            for key, name in (("queue_time_s", REQUEST_QUEUE_TIME_SECONDS), ("ttft_s", TIME_TO_FIRST_TOKEN_SECONDS))},
        "speculative_decoding": speculation_delta(before, after),
        "soak": None if run.soak_samples is None else verdict(run.soak_samples,
                                                               run.workload.warmup_s),
        "warnings": _warnings(summary, run),
        "requests": [_record_dict(r) for r in run.records],
    }


def speculation_delta(before: Exposition | None, after: Exposition | None) -> dict | None:
    """What the server's speculative decoding did during the run; None when it does not speculate."""
    if after is None or SPEC_DECODE_NUM_DRAFT_TOKENS not in after.counters:
        return None
    drafts, drafted, accepted = (counter_increase(before, after, name) or 0.0 for name in (
        SPEC_DECODE_NUM_DRAFTS, SPEC_DECODE_NUM_DRAFT_TOKENS, SPEC_DECODE_NUM_ACCEPTED_TOKENS))
    return {"drafts": int(drafts), "draft_tokens": int(drafted), "accepted_tokens": int(accepted),
            "acceptance_rate": accepted / drafted if drafted else None,
            "accepted_per_draft": accepted / drafts if drafts else None}


def write_result(result: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, allow_nan=False))


def load_result(path: Path) -> dict:
    try:
        result = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read bench result {path}: {exc}") from None
    if not isinstance(result, dict) or result.get("schema") != SCHEMA:
        raise ConfigError(f"{path} is not a `tally bench --out` result (schema {SCHEMA})")
    return result
