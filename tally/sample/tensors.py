"""The per-row sampling parameters of one batch as tensors, built once per batch composition.

Building walks the requests in Python; `Sampler` keeps the result and rebuilds only when the rows
change (same params, prompts and generators by identity), so a steady decode batch pays nothing."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tally.sample.batch import SamplerInput
from tally.sample.penalties import MinTokensTensors, PenaltyTensors
from tally.sample.token_edits import TokenEditTensors
from tally.sampling_params import SamplingType

# top-p first looks for the nucleus among this many most likely tokens (a top-1024 of 152k logits
# costs ~25 passes over them on CPU, a full sort ~500) and bisects only when their mass falls short.
TOP_P_CANDIDATES = 1024


@dataclass
class FilterTensors:
    """top-k / top-p of every random row (off rows hold the neutral value)."""

    top_k: torch.Tensor  # [R] int64; vocab_size = off
    top_p: torch.Tensor  # [R] float32; 1 = off
    top_k_list: list[int]  # host copies: per-chunk decisions without a device sync
    top_p_on: list[bool]
    vocab_size: int

    def take(self, positions: list[int]) -> FilterTensors:
        """The filters of these random rows only, in this order."""
        index = torch.tensor(positions, dtype=torch.long, device=self.top_k.device)
        return FilterTensors(self.top_k[index], self.top_p[index], [self.top_k_list[i] for i in positions],
                             [self.top_p_on[i] for i in positions], self.vocab_size)

    def num_candidates(self, rows: slice) -> int:
        """How many top logits rows[a:b] must look at; 0 when none of them filters."""
        vocab = self.vocab_size
        ks, ps = self.top_k_list[rows], self.top_p_on[rows]
        if all(k >= vocab for k in ks) and not any(ps):
            return 0
        wide_top_p = any(p and k >= vocab for k, p in zip(ks, ps))
        largest_k = max((k for k in ks if k < vocab), default=1)
        return min(vocab, max(largest_k, TOP_P_CANDIDATES if wide_top_p else 1))


@dataclass
class SamplingTensors:
    greedy_rows: torch.Tensor  # [G] batch rows
    random_rows: torch.Tensor  # [R] batch rows: those drawing from the shared generator first
    seeded_rows: list[int]  # batch rows with their own generator: the tail of random_rows
    temperature: torch.Tensor | None  # [R, 1]; None when all are 1
    # A plain row (temperature alone: no min-p, top-k or top-p) draws from its logits where they lie, its temperature
    # applied inside the draw; the others divide a copy before their filters (or, see candidates_in_place, have the
    # kernels scale what they read). A seeded row's arithmetic follows its own parameters alone, so it samples the
    # same in any batch.
    draw_temperature: torch.Tensor | None  # [R, 1]: plain rows' temperature, 1 elsewhere; None when all are 1
    filter_temperature: torch.Tensor | None  # [R, 1]: the other rows' temperature, 1 elsewhere; None when all are 1
    all_plain: bool
    # Every row unseeded, with top-k or top-p, and with top-k where it has min-p: their candidates can be found where
    # the rows lie, and where every kept token is one of them, drawn from them alone (tally/sample/sampler.py).
    candidates_in_place: bool
    log_min_p: torch.Tensor | None  # [R, 1]; None when no row uses min_p
    filters: FilterTensors | None
    penalties: PenaltyTensors | None
    token_edits: TokenEditTensors | None  # logit_bias, allowed_token_ids
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
        top_k_or_p = [0 < p.top_k < vocab_size or p.top_p < 1.0 for p in chosen]
        plain = [m == 0 and not filters for m, filters in zip(min_p, top_k_or_p)]
        min_p_with_k = [m == 0 or 0 < p.top_k < vocab_size for m, p in zip(min_p, chosen)]
        draw_t = [t if keep else 1.0 for t, keep in zip(temperature, plain)]
        filter_t = [1.0 if keep else t for t, keep in zip(temperature, plain)]
        asked = [i for i, p in enumerate(params) if p.logprobs is not None]
        return cls(
            greedy_rows=_long(greedy, device),
            random_rows=_long(random, device),
            seeded_rows=seeded,
            temperature=column(temperature) if any(t != 1.0 for t in temperature) else None,
            draw_temperature=column(draw_t) if any(t != 1.0 for t in draw_t) else None,
            filter_temperature=column(filter_t) if any(t != 1.0 for t in filter_t) else None,
            all_plain=all(plain),
            candidates_in_place=bool(chosen) and not seeded and all(top_k_or_p) and all(min_p_with_k),
            log_min_p=column([math.log(m) if m > 0 else -math.inf for m in min_p]) if any(min_p) else None,
            filters=_build_filters(chosen, vocab_size, device),
            penalties=PenaltyTensors.build(params, inp.prompt_token_ids, device),
            token_edits=TokenEditTensors.build(params, vocab_size, device),
            min_tokens=MinTokensTensors.build(params, inp.eos_token_ids, device),
            max_logprobs=max((params[i].logprobs for i in asked), default=0),
            logprob_rows=_long(asked, device) if asked else None,
            key=batch_key(inp),
            _keep_alive=(list(params), list(inp.prompt_token_ids), list(inp.generators)),
        )

    @property
    def num_unseeded(self) -> int:
        """How many of random_rows draw from the shared generator (they come first)."""
        return self.random_rows.numel() - len(self.seeded_rows)

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
    if all(k == vocab_size for k in top_k) and all(p == 1.0 for p in top_p):
        return None
    return FilterTensors(
        top_k=_long(top_k, device),
        top_p=torch.tensor(top_p, dtype=torch.float32, device=device),
        top_k_list=top_k,
        top_p_on=[p < 1.0 for p in top_p],
        vocab_size=vocab_size,
    )


def _long(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)
