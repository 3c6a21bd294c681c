"""The per-row sampling parameters of one batch as tensors, built once per batch composition.

Building walks the requests in Python; `Sampler` keeps the result and rebuilds only when the rows
change (same params, prompts and generators by identity), so a steady decode batch pays nothing."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from tally.layers.penalties import MinTokensTensors, PenaltyTensors
from tally.sampling_params import SamplingType

if TYPE_CHECKING:
    from tally.layers.sampler import SamplerInput

# top-p first looks for the nucleus among this many most likely tokens, and sorts the whole row
# only when their mass is still below top_p: a full sort of 152k logits costs ~100x a top-1024.
TOP_P_CANDIDATES = 1024


@dataclass
class FilterTensors:
    """top-k / top-p for the random rows that use either."""

    rows: torch.Tensor | None  # positions among the random rows; None = all of them
    top_k: torch.Tensor  # [S] int64; vocab_size = off
    top_p: torch.Tensor  # [S] float32; 1 = off
    num_candidates: int  # how many top logits to look at first
    use_top_p: bool


@dataclass
class SamplingTensors:
    greedy_rows: torch.Tensor  # [G] batch rows
    random_rows: torch.Tensor  # [R] batch rows: those drawing from the shared generator first
    seeded_rows: list[int]  # batch rows with their own generator, in random_rows order (the tail)
    temperature: torch.Tensor | None  # [R, 1]; None when all are 1
    log_min_p: torch.Tensor | None  # [R, 1]; None when no row uses min_p
    filters: FilterTensors | None
    penalties: PenaltyTensors | None
    min_tokens: MinTokensTensors | None
    max_logprobs: int  # top logprobs to return per row (the largest any row asked for)
    logprob_rows: torch.Tensor | None  # rows that asked for logprobs, whose rank is computed
    key: tuple
    _keep_alive: tuple  # holds the keyed objects so their ids cannot be reused while cached

    @classmethod
    def build(cls, inp: SamplerInput, vocab_size: int, device: torch.device) -> SamplingTensors:
        params = inp.params
        greedy = [i for i, p in enumerate(params) if p.sampling_type == SamplingType.GREEDY]
        random = [i for i, p in enumerate(params) if p.sampling_type != SamplingType.GREEDY]
        seeded = [i for i in random if inp.generators[i] is not None]
        random = [i for i in random if inp.generators[i] is None] + seeded
        chosen = [params[i] for i in random]

        def column(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32, device=device)[:, None]

        temperature = [p.temperature for p in chosen]
        min_p = [p.min_p for p in chosen]
        asked = [i for i, p in enumerate(params) if p.logprobs is not None]
        return cls(
            greedy_rows=_long(greedy, device),
            random_rows=_long(random, device),
            seeded_rows=seeded,
            temperature=column(temperature) if any(t != 1.0 for t in temperature) else None,
            log_min_p=column([math.log(m) if m > 0 else -math.inf for m in min_p]) if any(min_p) else None,
            filters=_build_filters(chosen, vocab_size, device),
            penalties=PenaltyTensors.build(params, inp.prompt_token_ids, device),
            min_tokens=MinTokensTensors.build(params, inp.eos_token_ids, device),
            max_logprobs=max((params[i].logprobs for i in asked), default=0),
            logprob_rows=_long(asked, device) if asked else None,
            key=batch_key(inp),
            _keep_alive=(list(params), list(inp.prompt_token_ids), list(inp.generators)),
        )

    def built_for(self, inp: SamplerInput) -> bool:
        return self.key == batch_key(inp)


def batch_key(inp: SamplerInput) -> tuple:
    return (
        tuple(map(id, inp.params)),
        tuple(map(id, inp.prompt_token_ids)),
        tuple(map(id, inp.generators)),
        tuple(map(tuple, inp.eos_token_ids)),
    )


def _build_filters(chosen: list, vocab_size: int, device: torch.device) -> FilterTensors | None:
    top_k = [p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in chosen]
    top_p = [p.top_p for p in chosen]
    pos = [j for j, (k, tp) in enumerate(zip(top_k, top_p)) if k < vocab_size or tp < 1.0]
    if not pos:
        return None
    use_top_p = any(top_p[j] < 1.0 for j in pos)
    largest_k = max((top_k[j] for j in pos if top_k[j] < vocab_size), default=1)
    return FilterTensors(
        rows=None if len(pos) == len(chosen) else _long(pos, device),
        top_k=_long([top_k[j] for j in pos], device),
        top_p=torch.tensor([top_p[j] for j in pos], dtype=torch.float32, device=device),
        num_candidates=min(vocab_size, max(largest_k, TOP_P_CANDIDATES if use_top_p else 1)),
        use_top_p=use_top_p,
    )


def _long(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)
