"""When requests are sent: Poisson or gamma (bursty) gaps at a rate, contiguous phases of rates,
or the timestamps of a trace. Produces the whole open-loop schedule before the run starts."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tally.errors import ConfigError
from tally.units import parse_duration_s, parse_rate_per_s

WARMUP = "warmup"


@dataclass(frozen=True)
class Phase:
    name: str
    rate_per_s: float | None  # None for replayed timestamps
    start_s: float
    end_s: float


@dataclass(frozen=True)
class RateArrivals:
    """Renewal process: gamma gaps with mean 1/rate; burstiness is the gamma shape (1 = Poisson,
    < 1 burstier, > 1 more regular); the gaps' coefficient of variation is 1/sqrt(burstiness)."""

    rate_per_s: float
    burstiness: float = 1.0
    phases: tuple[tuple[float, float], ...] = ()  # (rate_per_s, duration_s); empty = one rate

    def describe(self) -> dict:
        kind = "phases" if self.phases else ("poisson" if self.burstiness == 1.0 else "gamma")
        return {"kind": kind, "rate_per_s": self.rate_per_s, "burstiness": self.burstiness,
                "phases": [list(p) for p in self.phases]}


@dataclass(frozen=True)
class ReplayArrivals:
    arrival_s: np.ndarray  # trace timestamps, seconds from the first request
    time_scale: float = 1.0  # gaps are multiplied by this: 0.1 replays ten times faster

    def describe(self) -> dict:
        return {"kind": "replay", "time_scale": self.time_scale, "rows": len(self.arrival_s)}


@dataclass(frozen=True)
class Schedule:
    scheduled_s: np.ndarray  # float64 send times since run start, sorted
    phase: list[str]  # the phase each request belongs to
    trace_rows: np.ndarray | None  # replay: the trace row of each request
    phases: list[Phase]

    @property
    def warmup(self) -> np.ndarray:
        return np.array([p == WARMUP for p in self.phase], dtype=bool)


def parse_phases(text: str) -> tuple[tuple[float, float], ...]:
    """`'5/s:10s,50/s:2s,5/s:20s'` → ((5, 10), (50, 2), (5, 20))."""
    phases = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        rate, sep, duration = item.rpartition(":")
        if not sep:
            raise ConfigError(f"--phases item {item!r} needs RATE:DURATION, e.g. 5/s:10s")
        phases.append((parse_rate_per_s(rate), parse_duration_s(duration, "phase duration")))
    if not phases:
        raise ConfigError("--phases is empty; write e.g. '5/s:10s,50/s:2s,5/s:20s'")
    return tuple(phases)


def _gaps(rng: np.random.Generator, rate_per_s: float, burstiness: float, n: int) -> np.ndarray:
    return rng.gamma(burstiness, 1.0 / (rate_per_s * burstiness), n)


def _fill(rng: np.random.Generator, rate_per_s: float, burstiness: float, start_s: float,
          end_s: float, max_count: int | None) -> np.ndarray:
    """Arrivals in [start_s, end_s) (end may be inf when max_count bounds it)."""
    times: list[np.ndarray] = []
    t, count = start_s, 0
    block = max(16, int(min(rate_per_s * min(end_s - start_s, 3600.0), 100_000)) + 16)
    done = start_s >= end_s or max_count == 0
    while not done:
        chunk = t + np.cumsum(_gaps(rng, rate_per_s, burstiness, block))
        done = bool(chunk[-1] >= end_s)  # the first gap past the end closes the span
        chunk = chunk[chunk < end_s]
        if max_count is not None:
            chunk = chunk[: max_count - count]
            done = done or count + len(chunk) >= max_count
        times.append(chunk)
        t, count = (float(chunk[-1]) if len(chunk) else t), count + len(chunk)
    return np.concatenate(times) if times else np.zeros(0)


def _rate_schedule(arrivals: RateArrivals, rng: np.random.Generator, warmup_s: float,
                   duration_s: float | None, max_requests: int | None) -> Schedule:
    if arrivals.phases:
        first_rate = arrivals.phases[0][0]
        spans, start = [(WARMUP, first_rate, 0.0, warmup_s)] if warmup_s > 0 else [], warmup_s
        for i, (rate, length_s) in enumerate(arrivals.phases):
            spans.append((f"{i + 1}:{rate:g}/s", rate, start, start + length_s))
            start += length_s
    else:
        end = np.inf if duration_s is None else warmup_s + duration_s
        spans = [(WARMUP, arrivals.rate_per_s, 0.0, warmup_s)] if warmup_s > 0 else []
        spans.append((f"{arrivals.rate_per_s:g}/s", arrivals.rate_per_s, warmup_s, end))
    parts, names, phases = [], [], []
    for name, rate, start_s, end_s in spans:
        cap = max_requests if (name != WARMUP and end_s == np.inf) else None
        times = _fill(rng, rate, arrivals.burstiness, start_s, end_s, cap)
        parts.append(times)
        names += [name] * len(times)
        last = float(times[-1]) if end_s == np.inf and len(times) else end_s
        phases.append(Phase(name, rate, start_s, last))
    return Schedule(np.concatenate(parts), names, None, phases)


def _replay_schedule(arrivals: ReplayArrivals, warmup_s: float, duration_s: float | None,
                     max_requests: int | None) -> Schedule:
    times = arrivals.arrival_s * arrivals.time_scale
    rows = np.arange(len(times))
    is_warmup = times < warmup_s
    keep = is_warmup | (times < warmup_s + (np.inf if duration_s is None else duration_s))
    if max_requests is not None:
        keep &= is_warmup | (np.cumsum(~is_warmup) <= max_requests)
    times, rows, is_warmup = times[keep], rows[keep], is_warmup[keep]
    names = [WARMUP if w else "replay" for w in is_warmup]
    end_s = float(times[-1]) if len(times) else 0.0
    phases = ([Phase(WARMUP, None, 0.0, warmup_s)] if warmup_s > 0 else []) + [
        Phase("replay", None, warmup_s, max(end_s, warmup_s))]
    return Schedule(times, names, rows, phases)


def build_schedule(arrivals: RateArrivals | ReplayArrivals, seed: int, warmup_s: float,
                   duration_s: float | None, max_requests: int | None) -> Schedule:
    """The open-loop schedule. Warmup requests come first and are sent but not measured."""
    if isinstance(arrivals, ReplayArrivals):
        return _replay_schedule(arrivals, warmup_s, duration_s, max_requests)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 1]))
    return _rate_schedule(arrivals, rng, warmup_s, duration_s, max_requests)
