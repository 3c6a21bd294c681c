"""Speculative decoding's counters, vLLM's spec_decode ones: kept by the engine, copied into each snapshot."""
from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass
class SpeculationStats:
    """vLLM's spec_decode counters (tally/server/metrics.py serves them under the tally: prefix)."""

    num_drafts: int = 0  # requests that verified proposals, summed over steps
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)  # [j]: proposals at position j accepted
    last_num_speculative_tokens: float = 0.0  # mean proposals per speculating request, the last step with any

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    def copy(self) -> SpeculationStats:
        return replace(self, accepted_per_position=list(self.accepted_per_position))
