"""A server's /metrics in Prometheus' text format (prometheus_client's parser), read under its tally: or vllm: names,
and what changed between two reads of it: counters and histograms increase as Prometheus' increase() counts, a value
that went down meaning the server restarted and counted afresh."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tally.metric_names import METRICS_PREFIXES, spellings

Labels = dict[str, str]
QUANTILES = (50, 90, 99)


@dataclass
class Histogram:
    buckets: dict[float, float] = field(default_factory=dict)  # upper bound -> cumulative count
    sum: float = 0.0
    count: float = 0.0

    def add_samples(self, samples: list[Sample]) -> None:
        """A histogram family's samples (several label sets add up)."""
        for s in samples:
            if s.name.endswith("_bucket"):
                le = float(s.labels["le"])
                self.buckets[le] = self.buckets.get(le, 0.0) + s.value
            elif s.name.endswith("_sum"):
                self.sum += s.value
            elif s.name.endswith("_count"):
                self.count += s.value

    def summary(self) -> dict | None:
        """Count, mean and bucket-interpolated P50/P90/P99 of what it observed; None when it observed nothing."""
        if self.count <= 0:
            return None
        out = {"count": int(self.count), "mean": self.sum / self.count}
        bounds = sorted(self.buckets)
        for q in QUANTILES:
            rank, lower, below = q / 100 * self.count, 0.0, 0.0
            for bound in bounds:
                cumulative = self.buckets[bound]
                if cumulative >= rank:
                    inside = (rank - below) / (cumulative - below) if cumulative > below else 1.0
                    # past the last finite bucket only a lower bound is known: report that bound
                    out[f"p{q}"] = lower if bound == float("inf") else lower + (bound - lower) * inside
                    break
                lower, below = bound, cumulative
        return out


@dataclass
class Exposition:
    """One read of a /metrics: the series under its prefix (the first of tally:, vllm: that it serves; None when
    neither) by their names without it, and the unprefixed ones (process_*, http_requests)."""

    prefix: str | None
    gauges: dict[str, list[float]] = field(default_factory=dict)  # by label set
    counters: dict[str, list[tuple[Labels, float]]] = field(default_factory=dict)  # _total, by label set
    histograms: dict[str, Histogram] = field(default_factory=dict)  # label sets added up

    def served_as(self, table: dict, name: str) -> str | None:
        """The name, or the older vLLM name, under which `table` holds the series `name`."""
        return next((n for n in spellings(name) if n in table), None)

    def gauge(self, name: str) -> float | None:
        """The mean over its label sets (e.g. one per model); None when it is not served."""
        values = self.gauges.get(self.served_as(self.gauges, name))
        return sum(values) / len(values) if values else None

    def histogram(self, name: str) -> Histogram | None:
        return self.histograms.get(self.served_as(self.histograms, name))


def parse(text: str) -> Exposition:
    """ValueError when the text is not Prometheus' text format."""
    families = list(text_string_to_metric_families(text))
    prefix = next((p for p in METRICS_PREFIXES.values() if any(f.name.startswith(p) for f in families)), None)
    out = Exposition(prefix)
    for family in families:
        if prefix and family.name.startswith(prefix):
            _add(out, family.name[len(prefix):], family)
        elif not family.name.startswith(tuple(METRICS_PREFIXES.values())):  # process_*, http_requests
            _add(out, family.name, family)
    return out


def _add(out: Exposition, name: str, family: Metric) -> None:
    if family.type == "histogram":
        out.histograms.setdefault(name, Histogram()).add_samples(family.samples)
    elif family.type == "counter":
        out.counters[name] = [(s.labels, s.value) for s in family.samples if s.name.endswith("_total")]
    elif family.type in ("gauge", "unknown", "untyped"):
        out.gauges.setdefault(name, []).extend(s.value for s in family.samples)


def increase(before: float, after: float) -> float:
    """What a counter counted between two reads; one that went down was restarted and counted `after` since."""
    return after - before if after >= before else after


def counter_increase(before: Exposition | None, after: Exposition, name: str,
                     keep: Callable[[Labels], bool] = lambda labels: True) -> float | None:
    """The increase of the counter's label sets that `keep` accepts (`before` None: since the server started);
    None when `after` does not serve it."""
    served = after.served_as(after.counters, name)
    if served is None:
        return None
    earlier = {_key(labels): v for labels, v in before.counters.get(served, [])} if before else {}
    return sum(increase(earlier.get(_key(labels), 0.0), v) for labels, v in after.counters[served] if keep(labels))


def histogram_increase(before: Exposition | None, after: Exposition, name: str) -> Histogram | None:
    """What the histogram observed between two reads; None when `after` does not serve it."""
    served = after.served_as(after.histograms, name)
    if served is None:
        return None
    now = after.histograms[served]
    then = (before.histograms.get(served) if before else None) or Histogram()
    if now.count < then.count:  # restarted
        then = Histogram()
    return Histogram({b: increase(then.buckets.get(b, 0.0), c) for b, c in now.buckets.items()},
                     now.sum - then.sum, now.count - then.count)


def histogram_delta(before: Exposition | None, after: Exposition, name: str) -> dict | None:
    """The summary (Histogram.summary) of what the histogram observed between two reads."""
    observed = histogram_increase(before, after, name)
    return observed.summary() if observed else None


def _key(labels: Labels) -> tuple:
    return tuple(sorted(labels.items()))
