"""What a gate run holds fixed (decoding, sizes) and where its verdicts turn (thresholds).

Every threshold is a loss where larger is worse, so one rule reads them all:
loss < warn → pass, warn ≤ loss ≤ fail → warn, loss > fail → fail.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from tally.errors import ConfigError

SUITES = ("ppl", "tasks", "longtail")
VERDICTS = ("pass", "warn", "fail")  # in order of severity


@dataclass(frozen=True)
class Threshold:
    warn: float
    fail: float

    def __post_init__(self) -> None:
        if not 0 <= self.warn <= self.fail:
            raise ConfigError(f"threshold warn={self.warn} fail={self.fail}: need 0 ≤ warn ≤ fail")

    def verdict(self, loss: float) -> str:
        if loss > self.fail:
            return "fail"
        return "warn" if loss >= self.warn else "pass"


@dataclass(frozen=True)
class Thresholds:
    # perplexity increase, % of the baseline's perplexity
    ppl: Threshold = Threshold(2.0, 5.0)
    # drop of a task suite's score, in percentage points (30 items: one item is 3.3 points)
    tasks: Threshold = Threshold(5.0, 15.0)
    # mean token disagreement with the baseline on the long-tail suite, % of compared positions; high, since even a
    # sound int8 model disagrees on many positions of long outputs (docs/quality.md)
    longtail: Threshold = Threshold(40.0, 75.0)

    @classmethod
    def parse(cls, specs: list[str]) -> Thresholds:
        """['ppl=2,5', 'tasks=5,15'] → Thresholds; names not given keep their defaults."""
        given = {}
        for spec in specs:
            name, _, values = spec.partition("=")
            parts = values.split(",")
            if name not in SUITES or len(parts) != 2:
                raise ConfigError(f"threshold {spec!r}: write NAME=WARN,FAIL with NAME one of {', '.join(SUITES)}, "
                                  "e.g. ppl=2,5")
            try:
                given[name] = Threshold(float(parts[0]), float(parts[1]))
            except ValueError:
                raise ConfigError(f"threshold {spec!r}: WARN and FAIL must be numbers, e.g. ppl=2,5") from None
        return cls(**given)


@dataclass(frozen=True)
class Decoding:
    """The same for baseline and candidate, and printed in the report."""

    temperature: float = 0.0  # greedy
    max_tokens: int = 64
    batch_size: int = 32  # max_num_seqs: requests decoded together
    max_num_batched_tokens: int = 1024  # also bounds the prompt-logprob logits held at once


@dataclass(frozen=True)
class EvalSettings:
    suites: tuple[str, ...] = SUITES
    decoding: Decoding = field(default_factory=Decoding)
    thresholds: Thresholds = field(default_factory=Thresholds)
    ppl_tokens: int = 4096  # scored tokens, split evenly over the held-out texts
    ppl_window_tokens: int = 1024  # capped at max_model_len
    limit: int | None = None  # items per suite file (None: all)
    worst_cases: int = 5

    def __post_init__(self) -> None:
        unknown = [s for s in self.suites if s not in SUITES]
        if unknown or not self.suites:
            raise ConfigError(f"suites {', '.join(self.suites) or '(none)'}: choose from {', '.join(SUITES)}")
        if self.ppl_tokens < 2 or self.ppl_window_tokens < 2:
            raise ConfigError("--ppl-tokens and the perplexity window need at least 2 tokens")
        if self.decoding.max_tokens < 1:
            raise ConfigError(f"--max-tokens must be ≥ 1, got {self.decoding.max_tokens}")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"--limit must be ≥ 1, got {self.limit}")

    def to_dict(self) -> dict:
        return asdict(self)
