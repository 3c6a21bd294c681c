"""Next tokens for a batch of logits, vectorized over rows, in vLLM's order: allowed_token_ids and logit_bias,
bad_words, the min_tokens mask, penalties and the structured-output mask, then greedy rows take the argmax;
random rows get temperature, min-p, top-k and top-p, and draw their token at one U(0, 1) a row through the inverse
of the softmax's distribution function (`draw`). A seeded row takes its number from its own generator, so it samples
the same tokens alone or in any batch. Rows verifying a draft model's proposals keep or replace them by rejection
sampling (tally/sample/rejection.py); `distribution` gives the probabilities a draft model proposes from."""
from __future__ import annotations

import torch

from tally.native import ops
from tally.sample.batch import SamplerInput, SamplerOutput
from tally.sample.filters import apply_min_p, row_logsumexp, top_k_top_p
from tally.sample.penalties import apply_min_tokens, apply_penalties
from tally.sample.rejection import rejection_sample
from tally.sample.tensors import SamplingTensors
from tally.sample.token_edits import apply_bad_words, apply_token_edits

_CPU_CHUNK_ELEMENTS = 1 << 20  # 4 MiB of float32 per temporary


class Sampler:
    """Keeps the batch's SamplingTensors and scratch buffers between steps."""

    def __init__(self) -> None:
        self._tensors: SamplingTensors | None = None
        self._scratch: dict[str, torch.Tensor] = {}

    def __call__(self, logits: torch.Tensor, inp: SamplerInput) -> SamplerOutput:
        return self._sample(logits.float(), inp, self._tensors_for(logits, inp))

    def _tensors_for(self, logits: torch.Tensor, inp: SamplerInput) -> SamplingTensors:
        if self._tensors is None or not self._tensors.built_for(inp):
            self._tensors = SamplingTensors.build(inp, logits.shape[1], logits.device)
        return self._tensors

    def _buffer(self, name: str, rows: int, like: torch.Tensor, cols: int | None = None) -> torch.Tensor:
        cols = like.shape[1] if cols is None else cols
        buf = self._scratch.get(name)
        if buf is None or buf.shape[0] < rows or buf.shape[1] != cols or buf.device != like.device:
            buf = self._scratch[name] = torch.empty(rows, cols, dtype=like.dtype, device=like.device)
        return buf[:rows]

    def distribution(self, logits: torch.Tensor, inp: SamplerInput) -> torch.Tensor:
        """[B, V] the probabilities each row samples from: what a draft model proposes from (q). A greedy row is a
        point mass on its argmax."""
        t = self._tensors_for(logits, inp)
        work = self._processed(logits.float(), inp, t)
        probs = torch.zeros_like(work)
        if t.greedy_rows.numel():
            greedy = greedy_tokens(work.index_select(0, t.greedy_rows))
            probs[t.greedy_rows, greedy] = 1.0
        if t.random_rows.numel():
            probs[t.random_rows] = self._random_probs(work, t, t.random_rows)
        return probs

    def _processed(self, logits: torch.Tensor, inp: SamplerInput, t: SamplingTensors) -> torch.Tensor:
        """The logits after every per-request edit (token edits, bad words, min_tokens, penalties, the structured-
        output mask); `logits` itself when none applies (the raw logits stay intact for the logprobs)."""
        batch = logits.shape[0]
        short = t.min_tokens.active(inp.output_token_ids) if t.min_tokens is not None else []
        edits = t.token_edits is not None or inp.bad_words_token_ids is not None
        if t.penalties is None and not short and inp.allowed is None and not edits:
            return logits
        work = self._buffer("work", batch, logits).copy_(logits)
        if t.token_edits is not None:
            apply_token_edits(work, t.token_edits)
        if inp.bad_words_token_ids is not None:
            apply_bad_words(work, inp.bad_words_token_ids, inp.output_token_ids)
        if short:
            apply_min_tokens(work, t.min_tokens, short)
        if t.penalties is not None:
            apply_penalties(work, t.penalties, inp.output_token_ids)
        if inp.allowed is not None:
            rows, allowed = inp.allowed
            index = torch.tensor(rows, device=work.device)
            work.index_copy_(0, index, work.index_select(0, index).masked_fill_(~allowed, float("-inf")))
        return work

    def _sample(self, logits: torch.Tensor, inp: SamplerInput, t: SamplingTensors) -> SamplerOutput:
        batch, vocab = logits.shape
        work = self._processed(logits, inp, t)
        num_greedy = t.greedy_rows.numel()
        if num_greedy == batch and inp.draft is None:  # every row greedy (a plain decode batch): no index tensors
            return _with_logprobs(logits, greedy_tokens(work), t)
        token_ids = torch.empty(batch, dtype=torch.long, device=logits.device)
        for rows in row_chunks(num_greedy, vocab, logits.device):
            idx = t.greedy_rows[rows]
            token_ids[idx] = greedy_tokens(work.index_select(0, idx))
        num_random = t.random_rows.numel()
        if num_random and t.all_plain:  # temperature alone: each row drawn where it lies, no copy
            u = _uniforms(t, slice(0, num_random), inp.generators, logits.device)
            token_ids[t.random_rows] = draw(work, u, t.random_rows, t.draw_temperature)
        elif num_random and t.candidates_in_place and (drawn := _among_candidates(work, t, inp.generators)) is not None:
            token_ids[t.random_rows] = drawn
        else:
            for rows in row_chunks(num_random, vocab, logits.device):
                idx = t.random_rows[rows]
                x = torch.index_select(work, 0, idx, out=self._buffer("rows", idx.numel(), work))
                token_ids[idx] = self._sample_random_rows(x, t, rows, inp.generators)
        if inp.draft is not None:  # before the logprobs: they are the kept tokens'
            d = inp.draft
            token_ids[d.rows] = rejection_sample(self._random_probs(work, t, d.rows), d.probs, d.token_ids,
                                                 token_ids[d.rows])
        return _with_logprobs(logits, token_ids, t)

    def _random_probs(self, work: torch.Tensor, t: SamplingTensors, batch_rows: torch.Tensor) -> torch.Tensor:
        """[len(batch_rows), V] the distribution the random rows `batch_rows` sample from: softmax of their edited
        logits after temperature, min-p, top-k and top-p (what the race in _sample_random_rows draws from)."""
        where = torch.full((work.shape[0],), -1, dtype=torch.long, device=work.device)
        where[t.random_rows] = torch.arange(t.random_rows.numel(), device=work.device)
        pos = where[batch_rows]  # each row's index among the random rows, which the parameter tensors follow
        x = work.index_select(0, batch_rows)
        if t.temperature is not None:
            x.div_(t.temperature[pos])
        if t.log_min_p is not None:
            apply_min_p(x, t.log_min_p[pos])
        if t.filters is not None:
            filters = t.filters.take(pos.tolist())
            if num_candidates := filters.num_candidates(slice(0, len(pos))):
                cand = top_k_top_p(x, filters.top_k, filters.top_p, num_candidates)
                x.masked_fill_(x < cand.cutoff, float("-inf"))
        return torch.softmax(x, dim=-1)

    def _sample_random_rows(
        self, x: torch.Tensor, t: SamplingTensors, rows: slice, generators: list[torch.Generator | None]
    ) -> torch.Tensor:
        """Token ids for random rows[rows]; x holds their logits and is overwritten."""
        if t.filter_temperature is not None:
            x.div_(t.filter_temperature[rows])
        if t.log_min_p is not None:
            apply_min_p(x, t.log_min_p[rows])
        u = _uniforms(t, rows, generators, x.device)
        if t.filters is not None and (num_candidates := t.filters.num_candidates(rows)):
            cand = top_k_top_p(x, t.filters.top_k[rows], t.filters.top_p[rows], num_candidates)
            # Every kept token a candidate: draw among them alone, but not for a seeded row, whose draw must walk its
            # row in token order as it would in a batch whose other rows keep the whole row (not complete).
            if cand.complete and rows.stop <= t.num_unseeded:
                return cand.ids.gather(1, draw(cand.values, u)[:, None]).squeeze(1)
            x.masked_fill_(x < cand.cutoff, float("-inf"))
        return draw(x, u, temperature=None if t.draw_temperature is None else t.draw_temperature[rows])


def _among_candidates(work: torch.Tensor, t: SamplingTensors, generators: list[torch.Generator | None]
                      ) -> torch.Tensor | None:
    """Every random row's token drawn among its top-k / top-p candidates, found where the rows lie (no copy, no
    dividing pass: the kernels scale what they read); None where some row keeps tokens past its candidates (a
    nucleus wider than them), for the row-by-row path. Unseeded rows only: a seeded row walks its whole row in token
    order, as it would in any batch."""
    rows = slice(0, t.random_rows.numel())
    cand = top_k_top_p(work, t.filters.top_k, t.filters.top_p, t.filters.num_candidates(rows), t.random_rows,
                       t.filter_temperature, t.log_min_p)
    if not cand.complete:
        return None
    u = _uniforms(t, rows, generators, work.device)
    return cand.ids.gather(1, draw(cand.values, u)[:, None]).squeeze(1)


def sample(logits: torch.Tensor, inp: SamplerInput) -> SamplerOutput:
    """One-shot sampling; an engine keeps a `Sampler` instead, to reuse tensors across steps."""
    return Sampler()(logits, inp)


def row_chunks(num_rows: int, vocab: int, device: torch.device) -> list[slice]:
    """On CPU, groups of rows whose [rows, V] temporaries stay in cache: temporaries of a whole
    batch are fresh pages every step and cost ~4x the arithmetic. A GPU takes all rows at once."""
    step = num_rows if device.type != "cpu" else max(1, _CPU_CHUNK_ELEMENTS // vocab)
    return [slice(a, min(a + step, num_rows)) for a in range(0, num_rows, max(step, 1))]


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """argmax over the vocabulary, the first index of each row's maximum. On CPU the native kernel: torch's argmax
    is a scalar loop there, a visible share of a decode step over a large vocabulary (docs/benchmarks.md#sampler)."""
    if logits.device.type == "cpu" and ops.available():
        return ops.argmax_rows(logits)
    return logits.argmax(dim=-1)


def _uniforms(t: SamplingTensors, rows: slice, generators: list[torch.Generator | None],
              device: torch.device) -> torch.Tensor:
    """One U(0, 1) for each random row of rows[rows] (float64): rows without a generator share one draw, a seeded
    row takes its own generator's next number, so what it samples does not depend on its batch."""
    u = torch.empty(rows.stop - rows.start, dtype=torch.float64, device=device)
    shared = t.num_unseeded
    if rows.start < shared:
        u[: min(rows.stop, shared) - rows.start].uniform_()
    for j in range(max(rows.start, shared), rows.stop):
        u[j - rows.start].uniform_(generator=generators[t.seeded_rows[j - shared]])
    return u


def draw(logits: torch.Tensor, u: torch.Tensor, rows: torch.Tensor | None = None,
         temperature: torch.Tensor | None = None) -> torch.Tensor:
    """A token a row of logits [S, K] (-inf: dropped; with `rows` [S], the rows logits[rows]) at u [S] in [0, 1):
    the first, in order, whose running mass of softmax(logits / temperature) (temperature [S, 1]; none: 1) passes u
    of the row's. On CPU the native kernel (tally/native/sampling.h), one uniform a row where an exponential race
    draws one a token (docs/benchmarks.md#sampler); the torch form takes the rows it leaves (a NaN or +inf,
    nothing kept) and every row elsewhere."""
    tokens = None
    if logits.device.type == "cpu" and ops.available():
        tokens = ops.sample_rows(logits, u, rows, temperature)
        if bool((tokens >= 0).all()):
            return tokens
    left = torch.arange(u.shape[0], device=u.device) if tokens is None else (tokens < 0).nonzero().squeeze(1)
    x = logits.index_select(0, left if rows is None else rows[left])
    if temperature is not None:
        x = x / temperature[left]
    mass = x.sub(x.amax(dim=-1, keepdim=True)).exp_().double().cumsum_(dim=-1)
    picked = (mass > u[left, None] * mass[:, -1:]).int().argmax(dim=-1)  # NaN rows: no mass passes, token 0
    if tokens is None:
        return picked
    tokens[left] = picked
    return tokens


def _with_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, t: SamplingTensors) -> SamplerOutput:
    batch, vocab = logits.shape
    if t.logprob_rows is None:  # nobody asked: a logsumexp over the vocabulary costs a pass over it
        return SamplerOutput(token_ids, logits.new_zeros(batch), None, None)
    chosen = logits.gather(1, token_ids[:, None])
    lse = torch.empty_like(chosen)
    for rows in row_chunks(batch, vocab, logits.device):
        lse[rows] = row_logsumexp(logits[rows])
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
