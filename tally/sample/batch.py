"""What the sampler takes for one batch of logits, and what it gives back."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tally.sampling_params import SamplingParams


@dataclass
class DraftRows:
    """Rows that verify a draft model's proposal (speculative decoding): the row's token is the proposal, kept with
    probability min(1, p/q), else drawn from the residual (tally/sample/rejection.py)."""

    rows: torch.Tensor  # [R] batch rows
    token_ids: torch.Tensor  # [R] the proposals
    probs: torch.Tensor  # [R, V] q: the draft's distribution each proposal was drawn from


@dataclass
class SamplerInput:
    """Built by the engine each step, one entry per row of the logits."""

    params: list[SamplingParams]
    generators: list[torch.Generator | None]  # seeded requests own one, seeded once with `seed`
    output_token_ids: list[list[int]]  # generated so far (penalties, min_tokens)
    prompt_token_ids: list[list[int]]  # the repetition penalty covers prompt + output, like vLLM
    eos_token_ids: list[tuple[int, ...]]  # masked until min_tokens; empty for ignore_eos rows
    bad_words_token_ids: list[tuple[tuple[int, ...], ...]] | None = None  # per row; None when no row has any
    # Constrained rows (structured outputs): their indices and bool [len(rows), vocab] of the tokens allowed next.
    allowed: tuple[list[int], torch.Tensor] | None = None
    draft: DraftRows | None = None  # random rows verifying a draft model's proposals


@dataclass
class SamplerOutput:
    token_ids: torch.Tensor  # [B] int64
    logprobs: torch.Tensor  # [B] float32: chosen token under log_softmax of the raw logits (0 if no row asked)
    top_logprobs: tuple[torch.Tensor, torch.Tensor] | None  # ([B, k] ids, [B, k] logprobs), rank j+1
    ranks: torch.Tensor | None  # [B] rank of the chosen token (1 = top); 0 in rows without logprobs
