"""Next tokens for a batch of logits in one vectorized pass, in vLLM's order: the min_tokens mask
and penalties, then greedy rows take the argmax; random rows get temperature, min-p, top-k, top-p
and an exponential race (argmax of probs / Exp(1) noise). The race lets every seeded row draw its
noise from its own generator, so it samples the same tokens alone or in any batch."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tally.layers.penalties import apply_min_tokens, apply_penalties
from tally.layers.sampling_tensors import FilterTensors, SamplingTensors
from tally.outputs import Logprob
from tally.sampling_params import SamplingParams


@dataclass
class SamplerInput:
    """Built by the engine each step, one entry per row of the logits."""

    params: list[SamplingParams]
    generators: list[torch.Generator | None]  # seeded requests own one, seeded once with `seed`
    output_token_ids: list[list[int]]  # generated so far (penalties, min_tokens)
    prompt_token_ids: list[list[int]]  # the repetition penalty covers prompt + output, like vLLM
    eos_token_ids: list[tuple[int, ...]]  # masked until min_tokens; empty for ignore_eos rows


@dataclass
class SamplerOutput:
    token_ids: torch.Tensor  # [B] int64
    logprobs: torch.Tensor  # [B] float32: chosen token under log_softmax of the raw logits
    top_logprobs: tuple[torch.Tensor, torch.Tensor] | None  # ([B, k] ids, [B, k] logprobs), rank j+1
    ranks: torch.Tensor | None  # [B] rank of the chosen token (1 = top); 0 in rows without logprobs

    def logprobs_dict(self, row: int, num_logprobs: int) -> dict[int, Logprob]:
        """vLLM's per-token shape: the chosen token plus the top `num_logprobs` (decoded_token unset)."""
        token = int(self.token_ids[row])
        rank = int(self.ranks[row]) if self.ranks is not None else None
        out = {token: Logprob(float(self.logprobs[row]), rank)}
        if num_logprobs > 0 and self.top_logprobs is not None:
            ids, values = self.top_logprobs
            top = zip(ids[row, :num_logprobs].tolist(), values[row, :num_logprobs].tolist())
            for j, (tid, value) in enumerate(top):
                out.setdefault(tid, Logprob(value, j + 1))
        return out


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """The per-request generator a seeded request owns for its whole life."""
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


class Sampler:
    """Keeps the batch's SamplingTensors and scratch buffers between steps."""

    def __init__(self) -> None:
        self._tensors: SamplingTensors | None = None
        self._scratch: dict[str, torch.Tensor] = {}

    def __call__(self, logits: torch.Tensor, inp: SamplerInput) -> SamplerOutput:
        if self._tensors is None or not self._tensors.built_for(inp):
            self._tensors = SamplingTensors.build(inp, logits.shape[1], logits.device)
        return self._sample(logits.float(), inp, self._tensors)

    def _buffer(self, name: str, rows: int, like: torch.Tensor) -> torch.Tensor:
        buf = self._scratch.get(name)
        if buf is None or buf.shape[0] < rows or buf.shape[1] != like.shape[1] or buf.device != like.device:
            buf = self._scratch[name] = torch.empty(rows, like.shape[1], dtype=like.dtype, device=like.device)
        return buf[:rows]

    def _sample(self, logits: torch.Tensor, inp: SamplerInput, t: SamplingTensors) -> SamplerOutput:
        batch = logits.shape[0]
        short = t.min_tokens.active(inp.output_token_ids) if t.min_tokens is not None else []
        work = logits  # the raw logits stay intact for the logprobs below
        if t.penalties is not None or short:
            work = self._buffer("work", batch, logits).copy_(logits)
            if short:
                apply_min_tokens(work, t.min_tokens, short)
            if t.penalties is not None:
                apply_penalties(work, t.penalties, inp.output_token_ids)

        num_random = t.random_rows.numel()
        if num_random == 0:
            token_ids = work.argmax(dim=-1)
        else:
            token_ids = torch.empty(batch, dtype=torch.long, device=logits.device)
            if t.greedy_rows.numel():
                token_ids[t.greedy_rows] = work.index_select(0, t.greedy_rows).argmax(dim=-1)
            if num_random == batch and work is not logits:
                x = work
            else:
                x = torch.index_select(work, 0, t.random_rows, out=self._buffer("random", num_random, work))
            noise = self._buffer("noise", num_random, work)
            token_ids.index_copy_(0, t.random_rows, _sample_random(x, t, inp.generators, noise))
        return _with_logprobs(logits, token_ids, t)


def sample(logits: torch.Tensor, inp: SamplerInput) -> SamplerOutput:
    """One-shot sampling; an engine keeps a `Sampler` instead, to reuse tensors across steps."""
    return Sampler()(logits, inp)


def _sample_random(
    x: torch.Tensor, t: SamplingTensors, generators: list[torch.Generator | None], noise: torch.Tensor
) -> torch.Tensor:
    """Sample rows of x (modified in place): temperature, min-p, top-k/top-p, exponential race."""
    if t.temperature is not None:
        x.div_(t.temperature)
    if t.log_min_p is not None:  # p >= min_p * p_max  <=>  logit >= max_logit + log(min_p)
        x.masked_fill_(x < x.amax(dim=-1, keepdim=True) + t.log_min_p, float("-inf"))
    if t.filters is not None:
        _apply_top_k_top_p(x, t.filters)
    x.sub_(x.amax(dim=-1, keepdim=True)).exp_()  # unnormalised probs: the race ignores the scale
    # Exp(1) noise as -log(U): 4x cheaper than exponential_() on CPU. We divide by log(U) < 0,
    # so the winner is the argmin; a zero prob gives -0 and can never win.
    num_shared = x.shape[0] - len(t.seeded_rows)
    if num_shared:
        noise[:num_shared].uniform_()
    for j, row in enumerate(t.seeded_rows):
        noise[num_shared + j].uniform_(generator=generators[row])
    return x.div_(noise.log_()).argmin(dim=-1)


def _apply_top_k_top_p(x: torch.Tensor, f: FilterTensors) -> None:
    """Mask (to -inf) every logit below each row's top-k and top-p cutoff; ties at a cutoff stay."""
    rows = x if f.rows is None else x.index_select(0, f.rows)
    vocab = x.shape[1]
    top = rows.topk(f.num_candidates, dim=-1).values  # sorted, descending
    kth = top.gather(1, (f.top_k.clamp(max=f.num_candidates) - 1)[:, None])
    cutoff = torch.where(f.top_k[:, None] < vocab, kth, float("-inf"))
    if f.use_top_p:
        # vLLM renormalises after top-k: the nucleus is taken from the top-k survivors.
        top = top.masked_fill(top < cutoff, float("-inf"))
        lse = torch.logsumexp(rows.masked_fill(rows < cutoff, float("-inf")), dim=-1, keepdim=True)
        p_cut, unresolved = _top_p_cutoff(top, lse, f.top_p[:, None])
        unresolved &= f.top_k >= vocab  # with top-k on, the nucleus lies within the candidates
        if unresolved.any():  # nucleus reaches past the candidates: sort those rows in full
            idx = unresolved.nonzero().squeeze(1)
            full = rows.index_select(0, idx).masked_fill(rows.index_select(0, idx) < cutoff[idx], float("-inf"))
            p_cut[idx] = _top_p_cutoff(full.sort(dim=-1, descending=True).values, lse[idx], f.top_p[idx, None])[0]
        cutoff = torch.maximum(cutoff, p_cut)
    if f.rows is None:
        x.masked_fill_(x < cutoff, float("-inf"))
    else:
        x[f.rows] = rows.masked_fill_(rows < cutoff, float("-inf"))


def _top_p_cutoff(
    sorted_logits: torch.Tensor, lse: torch.Tensor, top_p: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """([S, 1] smallest kept logit, [S] whether the nucleus ended inside these candidates).

    A token is kept while the mass of the tokens above it is below top_p (vLLM's rule); the most
    likely token is always kept."""
    probs = (sorted_logits - lse).exp_()
    kept = (probs.cumsum(dim=-1) - probs) < top_p
    num_kept = kept.sum(dim=-1, keepdim=True).clamp_(min=1)
    cutoff = sorted_logits.gather(1, num_kept - 1)
    resolved = (num_kept.squeeze(1) < sorted_logits.shape[1]) | (top_p.squeeze(1) >= 1.0)
    return torch.where(top_p >= 1.0, float("-inf"), cutoff), ~resolved


def _with_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, t: SamplingTensors) -> SamplerOutput:
    lse = torch.logsumexp(logits, dim=-1)
    chosen = logits.gather(1, token_ids[:, None]).squeeze(1)
    top = None
    if t.max_logprobs > 0:
        values, ids = logits.topk(t.max_logprobs, dim=-1)
        top = (ids, values - lse[:, None])
    ranks = None
    if t.logprob_rows is not None:
        asked = logits.index_select(0, t.logprob_rows)
        ranks = torch.zeros_like(token_ids)
        ranks[t.logprob_rows] = (asked > chosen[t.logprob_rows, None]).sum(dim=-1) + 1
    return SamplerOutput(token_ids, chosen - lse, top, ranks)
