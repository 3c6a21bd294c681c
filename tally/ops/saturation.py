"""Whether a baseline was itself an overload: alert thresholds taken from one would call the overload normal. The
server's own word (requests turned away, timed out, or queued for a batch slot) refuses the baseline; latencies that
only look like queueing (first tokens far slower than whole answers) are warned about. docs/operations.md states
the rule."""
from __future__ import annotations

from dataclasses import dataclass

from tally.units import format_s

# failure causes that say the server could not keep up: a bench result's (http_<status>, timeout) and a live one's
TURNED_AWAY = ("http_429", "http_503", "rejected")
TIMED_OUT = ("http_504", "timeout", "timed_out")
QUEUE_P50_LIMIT_S = 0.5  # the typical request waited this long for a batch slot
FIRST_TOKEN_FACTOR = 4.0  # TTFT P99 beyond this many typical answers' decoding (TPOT P50 x mean output tokens)
FIRST_TOKEN_FLOOR_S = 2.0  # and beyond this: a tail nobody would page on is not called saturation


@dataclass(frozen=True)
class Saturation:
    refusals: tuple[str, ...]  # the server's own evidence: the baseline is refused
    warnings: tuple[str, ...]  # latencies that look like queueing: the baseline is used, loudly


def saturation(summary: dict, queue_time_s: dict | None) -> Saturation:
    """`summary`: a bench result's (or a live baseline's) summary; `queue_time_s`: the server's queue-time
    distribution over the run, where it was read."""
    errors = summary.get("errors") or {}
    refusals = []
    for causes, what in ((TURNED_AWAY, "turned away (429/503)"), (TIMED_OUT, "timed out")):
        count = sum(int(errors.get(cause, 0)) for cause in causes)
        if count:
            refusals.append(f"{count} request(s) {what}")
    queue_p50 = (queue_time_s or {}).get("p50")
    if queue_p50 is not None and queue_p50 > QUEUE_P50_LIMIT_S:
        refusals.append(f"half the requests waited over {format_s(queue_p50)} for a batch slot (server queue time "
                        f"P50; at most {format_s(QUEUE_P50_LIMIT_S)} in a healthy run)")
    warnings = []
    ttft_p99 = (summary.get("ttft_s") or {}).get("p99")
    tpot_p50 = (summary.get("tpot_s") or {}).get("p50")
    mean_output = (summary.get("output_tokens") or {}).get("mean")
    if ttft_p99 is not None and tpot_p50 and mean_output:
        answer_s = tpot_p50 * mean_output
        if ttft_p99 > max(FIRST_TOKEN_FACTOR * answer_s, FIRST_TOKEN_FLOOR_S):
            warnings.append(f"TTFT P99 {format_s(ttft_p99)} is over {FIRST_TOKEN_FACTOR:g}x the decoding of a typical "
                            f"answer (TPOT P50 {format_s(tpot_p50)} x {mean_output:.0f} tokens = "
                            f"{format_s(answer_s)}): requests queued for their first token")
    return Saturation(tuple(refusals), tuple(warnings))
