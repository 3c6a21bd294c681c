"""Prompt/output length distributions: log-normal (the shape real traffic has), fixed (the naive
baseline), or resampled from a trace; `fit_lognormal` turns a log into log-normal parameters."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Protocol

import numpy as np

from tally.errors import ConfigError
from tally.traces import Trace, load_trace
from tally.units import parse_pairs


class LengthSampler(Protocol):
    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """n (prompt_tokens, output_tokens) pairs as two int64 arrays."""

    def describe(self) -> dict:
        """JSON-able description, enough to rebuild the sampler."""


@dataclass(frozen=True)
class LogNormalLengths:
    prompt_median: float = 300.0
    prompt_sigma: float = 1.0
    output_median: float = 120.0
    output_sigma: float = 0.8
    prompt_min: int = 4
    prompt_max: int = 8192
    output_min: int = 1
    output_max: int = 2048

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        prompt = rng.lognormal(math.log(self.prompt_median), self.prompt_sigma, n)
        output = rng.lognormal(math.log(self.output_median), self.output_sigma, n)
        return (np.clip(np.rint(prompt), self.prompt_min, self.prompt_max).astype(np.int64),
                np.clip(np.rint(output), self.output_min, self.output_max).astype(np.int64))

    def describe(self) -> dict:
        return {"kind": "lognormal", **asdict(self)}

    def spec(self) -> str:
        """The `--lengths` argument that reproduces this distribution."""
        return "lognormal:" + ",".join(f"{k}={v:g}" for k, v in asdict(self).items())


@dataclass(frozen=True)
class FixedLengths:
    prompt_tokens: int
    output_tokens: int

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        return (np.full(n, self.prompt_tokens, dtype=np.int64),
                np.full(n, self.output_tokens, dtype=np.int64))

    def describe(self) -> dict:
        return {"kind": "fixed", "prompt_tokens": self.prompt_tokens,
                "output_tokens": self.output_tokens}


@dataclass(frozen=True)
class TraceLengths:
    """Resamples (prompt, output) rows of a trace jointly, so their correlation is kept."""

    trace: Trace

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        rows = rng.integers(0, len(self.trace), n)
        return (np.maximum(self.trace.prompt_tokens[rows], 1),
                np.maximum(self.trace.output_tokens[rows], 1))

    def describe(self) -> dict:
        return {"kind": "trace", "source": self.trace.source, "rows": len(self.trace)}


def lognormal_cdf(x: np.ndarray, median: float, sigma: float) -> np.ndarray:
    """CDF of a log-normal with the given median and log-space sigma."""
    z = (np.log(np.maximum(x, 1e-300)) - math.log(median)) / (sigma * math.sqrt(2.0))
    return 0.5 * (1.0 + np.vectorize(math.erf)(z))


def ks_statistic(samples: np.ndarray, median: float, sigma: float) -> float:
    """Kolmogorov-Smirnov D: the largest gap between the samples' empirical CDF and the
    log-normal's. At alpha 0.05 a true fit stays under 1.36 / sqrt(n)."""
    x = np.sort(np.asarray(samples, dtype=np.float64))
    n = len(x)
    cdf = lognormal_cdf(x, median, sigma)
    return float(max((np.arange(1, n + 1) / n - cdf).max(), (cdf - np.arange(n) / n).max()))


def fit_lognormal(trace: Trace) -> LogNormalLengths:
    """Maximum-likelihood log-normal fit (median = exp(mean log x), sigma = std log x); the clip
    bounds are the trace's own minimum and maximum."""
    prompt = np.maximum(trace.prompt_tokens, 1).astype(np.float64)
    output = np.maximum(trace.output_tokens, 1).astype(np.float64)
    return LogNormalLengths(
        prompt_median=round(float(np.exp(np.log(prompt).mean())), 1),
        prompt_sigma=round(float(np.log(prompt).std()), 3),
        output_median=round(float(np.exp(np.log(output).mean())), 1),
        output_sigma=round(float(np.log(output).std()), 3),
        prompt_min=int(prompt.min()), prompt_max=int(prompt.max()),
        output_min=int(output.min()), output_max=int(output.max()),
    )


def parse_lengths(spec: str) -> LengthSampler:
    """`lognormal:k=v,...` | `fixed:PROMPT,OUTPUT` | `trace:FILE` (a path, or `conv` / `code`)."""
    kind, _, args = spec.partition(":")
    kind = kind.strip().lower()
    if kind == "lognormal":
        fields = LogNormalLengths.__dataclass_fields__
        pairs = parse_pairs(args, "--lengths lognormal")
        unknown = sorted(set(pairs) - set(fields))
        if unknown:
            raise ConfigError(f"--lengths lognormal: unknown key(s) {', '.join(unknown)}; known: "
                              f"{', '.join(fields)}")
        try:
            values = {k: (int(v) if k.endswith(("_min", "_max")) else float(v))
                      for k, v in pairs.items()}
        except ValueError as exc:
            raise ConfigError(f"--lengths lognormal: {exc}") from None
        sampler = LogNormalLengths(**values)
        if min(sampler.prompt_median, sampler.output_median) <= 0 or min(
                sampler.prompt_sigma, sampler.output_sigma) < 0:
            raise ConfigError("--lengths lognormal: medians must be > 0 and sigmas >= 0")
        return sampler
    if kind == "fixed":
        parts = [p.strip() for p in args.split(",")]
        if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ConfigError(f"--lengths fixed needs two positive token counts, e.g. fixed:512,256 "
                              f"(got {spec!r})")
        return FixedLengths(int(parts[0]), int(parts[1]))
    if kind == "trace":
        return TraceLengths(load_trace(args.strip()))
    raise ConfigError(f"--lengths {spec!r}: use lognormal:..., fixed:P,O or trace:FILE")
