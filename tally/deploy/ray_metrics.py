"""One /metrics for every replica: each replica's own series (tally/server/metrics.py, names and buckets exactly
as a single `tally serve` serves them) labelled replica=<id>, merged family by family into one exposition, so
Prometheus scrapes one target however many replicas Ray runs or where."""
from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Metric, generate_latest


class _Families:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def merge_metrics(replicas: Iterable[list[Metric]]) -> bytes:
    """The text exposition of every replica's families; a family appears once, holding all replicas' samples
    (the text format forbids a family's TYPE line twice)."""
    merged: dict[str, Metric] = {}
    for families in replicas:
        for family in families:
            if family.name in merged:
                merged[family.name].samples.extend(family.samples)
            else:
                merged[family.name] = family
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(merged.values())))
    return generate_latest(registry)
