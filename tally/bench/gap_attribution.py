"""Where a run's long inter-token gaps came from: each gap a `tally bench` run received that is longer than a multiple
of the median gap, joined with the server's steps around it (`tally serve --step-log`: one JSON line a step, on the
host's monotonic clock, which the run's `clock_origin_s` reads too), and put down to one cause:

- long step: one step covers most of the gap (its prompt tokens, decode rows and predicted seconds say why);
- sat out steps: two or more steps ended inside the gap, none of them most of it (the stream got no token from one);
- delivery: the token came most of the gap after the step that made it ended (hand-off, event loop, writes);
- between steps: most of the gap no step ran (the engine loop's own work, or waiting for the CPU)."""
from __future__ import annotations

import bisect
import json
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

CAUSES = ("long step", "sat out steps", "delivery", "between steps")


@dataclass(frozen=True)
class Step:
    start_s: float
    end_s: float
    prompt_tokens: int
    decode_rows: int
    waiting: int
    predicted_s: float | None  # the step cost fit's figure before it ran; None before a fit
    slice_tokens: int = 0  # a held prompt pass's tokens the step ran some layers of, after its decodes
    slice_ends: bool = False  # ... and the pass's last layers: its prompt tokens are computed in this step

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s

    @property
    def prompt_work(self) -> int:
        """Prompt tokens the step computed whole or ran a slice of."""
        return self.prompt_tokens or self.slice_tokens


@dataclass(frozen=True)
class Gap:
    start_s: float
    end_s: float
    cause: str
    step: Step | None  # the step that covers most of the gap
    steps_ended: int  # steps that ended inside it
    delivery_s: float  # from the end of the last step before the token to the token

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s


def read_steps(lines: Iterable[str]) -> list[Step]:
    """A `--step-log` file's lines, in the order the steps ended."""
    steps = []
    for line in lines:
        if line.strip():
            d = json.loads(line)
            sliced = d.get("slice")
            steps.append(Step(d["start_s"], d["start_s"] + d["seconds"], d["prompt_tokens"], d["decode_rows"],
                              d["waiting"], d["predicted_s"], sliced["tokens"] if sliced else 0,
                              bool(sliced) and sliced["layers"][1] == sliced["of"]))
    return sorted(steps, key=lambda s: s.end_s)


def token_times(result: dict) -> list[list[float]]:
    """Each measured, successful request's token arrival times on the host's monotonic clock."""
    origin, out = result["clock_origin_s"], []
    for r in result["requests"]:
        if r["warmup"] or r["error"] is not None or r["first_token_s"] is None:
            continue
        t = [origin + r["first_token_s"]]
        for gap in r["itl_s"]:
            t.append(t[-1] + gap)
        out.append(t)
    return out


def long_gaps(result: dict, steps: list[Step], times: float) -> tuple[float, list[Gap]]:
    """The median gap of the run, and its gaps longer than `times` that, each with its cause."""
    streams = token_times(result)
    gaps = [b - a for t in streams for a, b in zip(t, t[1:])]
    median = statistics.median(gaps) if gaps else 0.0
    ends = [s.end_s for s in steps]
    return median, [attribute(a, b, steps, ends) for t in streams for a, b in zip(t, t[1:])
                    if b - a > times * median]


def attribute(a: float, b: float, steps: list[Step], ends: list[float]) -> Gap:
    """The cause of the gap (a, b); `ends`: the steps' end times, sorted as `steps` are."""
    gap_s = b - a
    last = bisect.bisect_right(ends, b) - 1  # the step whose token reached the client at b
    delivery_s = b - ends[last] if last >= 0 else gap_s
    ended = bisect.bisect_right(ends, b) - bisect.bisect_right(ends, a)
    overlapping = [s for s in steps[max(0, bisect.bisect_right(ends, a)):last + 2] if s.start_s < b]
    covered = [(min(b, s.end_s) - max(a, s.start_s), s) for s in overlapping]
    longest_s, step = max(covered, key=lambda c: c[0], default=(0.0, None))
    if delivery_s >= gap_s / 2:
        cause = "delivery"
    elif longest_s >= gap_s / 2:
        cause = "long step"
    elif ended >= 2:
        cause = "sat out steps"
    else:
        cause = "between steps"
    return Gap(a, b, cause, step, ended, delivery_s)


def describe(median_s: float, gaps: list[Gap], steps: list[Step], times: float) -> list[str]:
    """A few lines for a person: the causes' shares, what the long steps carried, and the steps overall."""
    lines = [f"gaps > {times:g}x the median ({median_s * 1e3:.0f} ms): {len(gaps)}"]
    for cause in CAUSES:
        mine = [g for g in gaps if g.cause == cause]
        if mine:
            lines.append(f"  {cause:<14} {len(mine):>5} ({len(mine) / len(gaps):4.0%}), median gap "
                         f"{statistics.median(g.seconds for g in mine) * 1e3:.0f} ms, median delivery "
                         f"{statistics.median(g.delivery_s for g in mine) * 1e3:.0f} ms")
    long = [g.step for g in gaps if g.cause == "long step"]
    if long:
        mixed = [s for s in long if s.prompt_work]
        lines.append(f"  long steps: {len(mixed)} of {len(long)} carried prompt tokens or a pass's slice (median "
                     f"{statistics.median(s.prompt_work for s in mixed) if mixed else 0:.0f}), median decode rows "
                     f"{statistics.median(s.decode_rows for s in long):.0f}, prompts waiting "
                     f"{statistics.median(s.waiting for s in long):.0f}" + _predicted(mixed))
    lines += [f"steps: {line}" for line in step_lines(steps)]
    return lines


def step_lines(steps: list[Step]) -> list[str]:
    """Decode-only steps, those with prompt chunks and those with a slice of a prompt pass: how many, and their
    median and P99 seconds."""
    out = []
    for name, mine in (("decode-only", [s for s in steps if not s.prompt_work]),
                       ("with prompt tokens", [s for s in steps if s.prompt_tokens]),
                       ("with a prompt pass's slice", [s for s in steps if s.slice_tokens])):
        if mine:
            secs = sorted(s.seconds for s in mine)
            out.append(f"{name} {len(mine)}: median {secs[len(secs) // 2] * 1e3:.0f} ms, P99 "
                       f"{secs[min(len(secs) - 1, int(0.99 * len(secs)))] * 1e3:.0f} ms"
                       + (_predicted(mine) if mine[0].prompt_tokens else ""))
    return out


def _predicted(steps: list[Step]) -> str:
    ratios = [s.seconds / s.predicted_s for s in steps if s.predicted_s]
    return f", actual / predicted median {statistics.median(ratios):.2f}x" if ratios else ""
