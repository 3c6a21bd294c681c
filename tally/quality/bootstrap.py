"""Percentile bootstrap confidence intervals of a mean, and of the mean paired difference of two models' scores on
the same items (resampling items, so each resample keeps each item's two scores together)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RESAMPLES = 10_000
SEED = 0  # fixed: the same scores always give the same interval
CHUNK_VALUES = 4_000_000  # resampled values held at once (32 MB of float64)


@dataclass(frozen=True)
class Interval:
    estimate: float  # the mean over the items themselves
    low: float
    high: float


def mean_ci(values: np.ndarray, confidence: float = 0.95, resamples: int = RESAMPLES, seed: int = SEED) -> Interval:
    """Draw len(values) items with replacement `resamples` times; the interval holds the central `confidence` share
    of the resampled means."""
    values = np.asarray(values, dtype=np.float64)
    n = len(values)
    if n == 0:
        raise ValueError("a confidence interval needs at least one value")
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    step = max(1, CHUNK_VALUES // n)
    for start in range(0, resamples, step):
        count = min(step, resamples - start)
        means[start:start + count] = values[rng.integers(0, n, size=(count, n))].mean(axis=1)
    tail = (1.0 - confidence) / 2
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return Interval(float(values.mean()), float(low), float(high))


def paired_diff_ci(baseline: np.ndarray, candidate: np.ndarray, confidence: float = 0.95,
                   resamples: int = RESAMPLES, seed: int = SEED) -> Interval:
    """candidate − baseline, item by item, then mean_ci: the interval of the mean score change."""
    baseline, candidate = np.asarray(baseline, dtype=np.float64), np.asarray(candidate, dtype=np.float64)
    if baseline.shape != candidate.shape:
        raise ValueError(f"paired scores differ in length: {baseline.shape} vs {candidate.shape}")
    return mean_ci(candidate - baseline, confidence, resamples, seed)
