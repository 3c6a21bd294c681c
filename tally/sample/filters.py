"""min-p, top-k and top-p on temperature-scaled logits, without sorting whole rows.

top-k and top-p look at the row's most likely `num_candidates` tokens (one `topk`). When every
row's kept tokens are among them, the sampler can race over the candidates alone; a row whose
top-p nucleus is wider (a flat distribution) gets its cutoff by bisection instead of a full sort,
which on CPU costs ~500 passes over the row."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tally.native import ops

# Tokens this far below the top logit hold < 152k * e^-50 of the mass together: never in a nucleus.
_NEGLIGIBLE_LOGIT_GAP = 50.0
_FULL_ROW_STEPS = 8  # bisection steps over whole rows, narrowing the band to 50 / 2**8 ~ 0.2
_BAND_STEPS = 18  # then over the band's tokens only, down to ~1e-6: a float32 ulp near 10


@dataclass
class Candidates:
    values: torch.Tensor  # [S, K] logits, descending; -inf where top-k / top-p drop them
    ids: torch.Tensor  # [S, K] their token ids
    cutoff: torch.Tensor  # [S, 1] smallest kept logit of each row (-inf: no cut)
    complete: bool  # every kept token of every row is among the candidates


def apply_min_p(x: torch.Tensor, log_min_p: torch.Tensor) -> None:
    """Keep p >= min_p * p_max, i.e. logit >= max_logit + log(min_p); log(0) = -inf keeps all."""
    x.masked_fill_(x < x.amax(dim=-1, keepdim=True) + log_min_p, float("-inf"))


def top_k_top_p(x: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, num_candidates: int,
                rows: torch.Tensor | None = None, temperature: torch.Tensor | None = None,
                log_min_p: torch.Tensor | None = None) -> Candidates:
    """Cutoffs per row (x is not modified); top_k = vocab and top_p = 1 mean off. Ties at a cutoff
    stay, and top-p is taken from the top-k survivors, as in vLLM. With `rows` ([S] indices into x) and
    `temperature` ([S, 1]), the rows are x[rows] / temperature, read where they lie (scaled_rows). `log_min_p`
    ([S, 1]) applies min-p first, to the candidates: what apply_min_p keeps of them, for rows with top-k (a row
    without one would need its whole row's mass after min-p)."""
    vocab = x.shape[1]
    k_on = top_k[:, None] < vocab
    values, ids = top_candidates(x, num_candidates, rows, temperature)
    if log_min_p is not None:  # the first candidate is the row's max, as apply_min_p's amax
        values = values.masked_fill(values < values[:, :1] + log_min_p, float("-inf"))
    kth = values.gather(1, (top_k.clamp(max=num_candidates) - 1)[:, None])
    cutoff = torch.where(k_on, kth, float("-inf"))
    # A row with neither filter keeps its whole row, so candidates cannot stand in for it.
    complete = bool((k_on.squeeze(1) | (top_p < 1.0)).all())
    if bool((top_p < 1.0).any()):
        values = values.masked_fill(values < cutoff, float("-inf"))
        # The top-k survivors are all candidates; a row without top-k needs its whole row's mass.
        lse = torch.logsumexp(values, dim=-1, keepdim=True)
        if not bool(k_on.all()):
            lse = torch.where(k_on, lse, row_logsumexp(x, rows, temperature))
        p_cut, wider = _nucleus_cutoff(values, lse, top_p[:, None])
        wider &= ~k_on.squeeze(1) & (num_candidates < vocab)
        if bool(wider.any()):
            idx = wider.nonzero().squeeze(1)
            p_cut[idx] = _bisect_nucleus_cutoff(scaled_rows(x, rows, temperature, idx), lse[idx], top_p[idx, None],
                                                values[idx, -1:])
            complete = False
        cutoff = torch.maximum(cutoff, p_cut)
    return Candidates(values.masked_fill(values < cutoff, float("-inf")), ids, cutoff, complete)


def scaled_rows(x: torch.Tensor, rows: torch.Tensor | None, temperature: torch.Tensor | None,
                which: torch.Tensor | None = None) -> torch.Tensor:
    """A copy of rows `which` (all by default) of x[rows] / temperature (rows [S] indices into x, or None: x's own;
    temperature [S, 1] or None: 1)."""
    n = x.shape[0] if rows is None else rows.shape[0]
    which = torch.arange(n, device=x.device) if which is None else which
    out = x.index_select(0, which if rows is None else rows[which])
    return out if temperature is None else out.div_(temperature[which])


def row_logsumexp(x: torch.Tensor, rows: torch.Tensor | None = None,
                  temperature: torch.Tensor | None = None) -> torch.Tensor:
    """[S, 1] logsumexp of each row of [S, V] (of x[rows] / temperature: scaled_rows): on CPU the native kernel (one
    pass of exps after the max, where torch's takes several: docs/benchmarks.md#sampler)."""
    if x.device.type != "cpu" or not ops.available():
        xs = x if rows is None and temperature is None else scaled_rows(x, rows, temperature)
        return torch.logsumexp(xs, dim=-1, keepdim=True)
    return ops.logsumexp_rows(x, rows, temperature)


def top_candidates(x: torch.Tensor, k: int, rows: torch.Tensor | None = None,
                   temperature: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's k largest logits and their ids, descending: x.topk(k) (of x[rows] / temperature: scaled_rows). On
    CPU the native kernel (one pass above a rising threshold, faster than torch's topk:
    docs/benchmarks.md#sampler), torch's for the rows it leaves (a NaN)."""
    if x.device.type != "cpu" or not ops.available():
        xs = x if rows is None and temperature is None else scaled_rows(x, rows, temperature)
        return xs.topk(k, dim=-1)
    values, ids, done = ops.top_rows(x, k, rows, temperature)
    if not bool(done.all()):
        rest = (~done).nonzero().squeeze(1)
        values[rest], ids[rest] = scaled_rows(x, rows, temperature, rest).topk(k, dim=-1)
    return values, ids


def _nucleus_cutoff(
    sorted_logits: torch.Tensor, lse: torch.Tensor, top_p: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """([S, 1] smallest kept logit, [S] nucleus may reach past these logits).

    vLLM's rule: a token is kept while the mass of the tokens above it is below top_p, so the
    most likely token always is."""
    probs = (sorted_logits - lse).exp_()
    kept = (probs.cumsum(dim=-1) - probs) < top_p
    num_kept = kept.sum(dim=-1, keepdim=True).clamp_(min=1)
    cutoff = torch.where(top_p >= 1.0, float("-inf"), sorted_logits.gather(1, num_kept - 1))
    wider = (num_kept.squeeze(1) == sorted_logits.shape[1]) & (top_p.squeeze(1) < 1.0)
    return cutoff, wider


def _bisect_nucleus_cutoff(
    x: torch.Tensor, lse: torch.Tensor, top_p: torch.Tensor, last_candidate: torch.Tensor
) -> torch.Tensor:
    """[S, 1] top-p cutoff of rows whose nucleus is wider than the candidates.

    Bisects on the logit threshold (the mass at or above it falls as it rises), keeping the
    invariant: mass(x >= lo) reaches top_p, mass(x >= hi) does not. A few steps over whole rows
    narrow [lo, hi) to a band; the rest only touch the band's tokens. Tokens within ~1e-6 of
    the exact cutoff may be kept with it."""
    probs = (x - lse).exp_()
    hi = torch.nextafter(last_candidate, torch.full_like(last_candidate, float("inf")))
    lo = x.amax(dim=-1, keepdim=True) - _NEGLIGIBLE_LOGIT_GAP

    def mass_at_or_above(threshold: torch.Tensor) -> torch.Tensor:
        return torch.where(x >= threshold, probs, 0.0).sum(dim=-1, keepdim=True)

    for _ in range(_FULL_ROW_STEPS):
        mid = (lo + hi) / 2
        reaches = mass_at_or_above(mid) >= top_p
        lo, hi = torch.where(reaches, mid, lo), torch.where(reaches, hi, mid)
    above_band = mass_at_or_above(hi).squeeze(1)
    rows, cols = ((x >= lo) & (x < hi)).nonzero(as_tuple=True)
    band_logits, band_probs = x[rows, cols], probs[rows, cols]
    for _ in range(_BAND_STEPS):
        mid = (lo + hi) / 2
        in_band = torch.where(band_logits >= mid[rows, 0], band_probs, 0.0)
        mass = above_band.index_add(0, rows, in_band)[:, None]
        reaches = mass >= top_p
        lo, hi = torch.where(reaches, mid, lo), torch.where(reaches, hi, mid)
    return lo
