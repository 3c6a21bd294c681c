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

# Tokens this far below the top logit hold < 152k * e^-50 of the mass together: never in a nucleus.
_NEGLIGIBLE_LOGIT_GAP = 50.0
_BISECT_STEPS = 26  # 50 / 2**26 ~ 1e-6: about one float32 ulp of a logit near 10
_CPU_CHUNK_ELEMENTS = 1 << 20  # 4 MiB of float32 per temporary


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
        batch, vocab = logits.shape
        short = t.min_tokens.active(inp.output_token_ids) if t.min_tokens is not None else []
        work = logits  # the raw logits stay intact for the logprobs
        if t.penalties is not None or short:
            work = self._buffer("work", batch, logits).copy_(logits)
            if short:
                apply_min_tokens(work, t.min_tokens, short)
            if t.penalties is not None:
                apply_penalties(work, t.penalties, inp.output_token_ids)

        token_ids = torch.empty(batch, dtype=torch.long, device=logits.device)
        for rows in row_chunks(t.greedy_rows.numel(), vocab, logits.device):
            idx = t.greedy_rows[rows]
            token_ids[idx] = work.index_select(0, idx).argmax(dim=-1)
        num_random = t.random_rows.numel()
        num_shared = num_random - len(t.seeded_rows)
        for rows in row_chunks(num_random, vocab, logits.device):
            n = rows.stop - rows.start
            x = torch.index_select(work, 0, t.random_rows[rows], out=self._buffer("rows", n, work))
            noise = self._buffer("noise", n, work)
            # Rows without a generator share one draw; a seeded row draws its own V numbers, the
            # same ones whichever batch it is in.
            if rows.start < num_shared:
                noise[: min(rows.stop, num_shared) - rows.start].uniform_()
            for j in range(max(rows.start, num_shared), rows.stop):
                noise[j - rows.start].uniform_(generator=inp.generators[t.seeded_rows[j - num_shared]])
            token_ids[t.random_rows[rows]] = _sample_rows(x, t, rows, noise)
        return _with_logprobs(logits, token_ids, t)


def sample(logits: torch.Tensor, inp: SamplerInput) -> SamplerOutput:
    """One-shot sampling; an engine keeps a `Sampler` instead, to reuse tensors across steps."""
    return Sampler()(logits, inp)


def row_chunks(num_rows: int, vocab: int, device: torch.device) -> list[slice]:
    """On CPU, groups of rows whose [rows, V] temporaries stay in cache: temporaries of a whole
    batch are fresh pages every step and cost ~4x the arithmetic. A GPU takes all rows at once."""
    step = num_rows if device.type != "cpu" else max(1, _CPU_CHUNK_ELEMENTS // vocab)
    return [slice(a, min(a + step, num_rows)) for a in range(0, num_rows, max(step, 1))]


def _sample_rows(x: torch.Tensor, t: SamplingTensors, rows: slice, noise: torch.Tensor) -> torch.Tensor:
    """Sample random rows x (= random rows[rows], modified in place) given uniform noise."""
    if t.temperature is not None:
        x.div_(t.temperature[rows])
    if t.log_min_p is not None:  # p >= min_p * p_max  <=>  logit >= max_logit + log(min_p)
        x.masked_fill_(x < x.amax(dim=-1, keepdim=True) + t.log_min_p[rows], float("-inf"))
    if t.filters is not None and (num_candidates := t.filters.num_candidates(rows)):
        _apply_top_k_top_p(x, t.filters.top_k[rows], t.filters.top_p[rows], num_candidates)
    x.sub_(x.amax(dim=-1, keepdim=True)).exp_()  # unnormalised probs: the race ignores the scale
    # The race: argmax of probs / E with E ~ Exp(1). E = -log(U) is 4x cheaper than exponential_()
    # on CPU; dividing by log(U) < 0 flips the sign, so the winner is the argmin, and a zero prob
    # gives -0 and never wins.
    return x.div_(noise.log_()).argmin(dim=-1)


def _apply_top_k_top_p(x: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, num_candidates: int) -> None:
    """Mask (to -inf) every logit below each row's top-k and top-p cutoff; ties at a cutoff stay."""
    vocab = x.shape[1]
    k_on = top_k[:, None] < vocab
    top = x.topk(num_candidates, dim=-1).values  # sorted, descending
    kth = top.gather(1, (top_k.clamp(max=num_candidates) - 1)[:, None])
    cutoff = torch.where(k_on, kth, float("-inf"))
    if bool((top_p < 1.0).any()):
        # vLLM renormalises after top-k: the nucleus is taken from the top-k survivors, which
        # are all among the candidates; rows without top-k need the whole row's mass.
        top = top.masked_fill(top < cutoff, float("-inf"))
        lse = torch.logsumexp(top, dim=-1, keepdim=True)
        if not bool(k_on.all()):
            lse = torch.where(k_on, lse, torch.logsumexp(x, dim=-1, keepdim=True))
        p_cut, unresolved = _top_p_cutoff(top, lse, top_p[:, None])
        unresolved &= ~k_on.squeeze(1)
        if bool(unresolved.any()):  # the nucleus reaches past the candidates
            idx = unresolved.nonzero().squeeze(1)
            p_cut[idx] = _bisect_top_p_cutoff(x[idx], lse[idx], top_p[idx, None], top[idx, -1:])
        cutoff = torch.maximum(cutoff, p_cut)
    x.masked_fill_(x < cutoff, float("-inf"))


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


def _bisect_top_p_cutoff(
    x: torch.Tensor, lse: torch.Tensor, top_p: torch.Tensor, last_candidate: torch.Tensor
) -> torch.Tensor:
    """[S, 1] cutoff logit for rows whose nucleus holds more than the candidates (flat distributions).

    Bisects on the logit threshold, since the mass above it falls as it rises: ~25 cheap passes
    instead of a full sort of the row, which costs ~200 passes on CPU. Invariant: the mass at or
    above `lo` reaches top_p, the mass at or above `hi` does not. Tokens within ~1e-6 of the true
    cutoff may be kept with it."""
    probs = (x - lse).exp_()
    hi = torch.nextafter(last_candidate, torch.tensor(float("inf"), device=x.device))
    lo = x.amax(dim=-1, keepdim=True) - _NEGLIGIBLE_LOGIT_GAP
    for _ in range(_BISECT_STEPS):
        mid = (lo + hi) / 2
        reaches = torch.where(x >= mid, probs, 0.0).sum(dim=-1, keepdim=True) >= top_p
        lo, hi = torch.where(reaches, mid, lo), torch.where(reaches, hi, mid)
    return lo


def _with_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, t: SamplingTensors) -> SamplerOutput:
    batch, vocab = logits.shape
    chosen = logits.gather(1, token_ids[:, None])
    lse = torch.empty_like(chosen)
    for rows in row_chunks(batch, vocab, logits.device):
        lse[rows] = torch.logsumexp(logits[rows], dim=-1, keepdim=True)
    top = None
    if t.max_logprobs > 0:
        values, ids = logits.topk(t.max_logprobs, dim=-1)
        top = (ids, values - lse)
    ranks = None
    if t.logprob_rows is not None:
        ranks = torch.zeros_like(token_ids)
        for rows in row_chunks(t.logprob_rows.numel(), vocab, logits.device):
            idx = t.logprob_rows[rows]
            ranks[idx] = (logits.index_select(0, idx) > chosen[idx]).sum(dim=-1) + 1
    return SamplerOutput(token_ids, (chosen - lse).squeeze(1), top, ranks)
