"""The sampler's native kernels (tally/native/sampling.h) against torch: argmax, logsumexp, top-k and the draw, with
NaNs, infinities, ties and rows read in place at their temperature."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tally.native import ops

pytestmark = pytest.mark.skipif(not ops.available(), reason="native kernels unavailable (see tally/native/library.py)")

gen = torch.Generator().manual_seed(0)


def rand(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen)


def test_argmax_rows_gives_torchs_first_index_of_the_maximum() -> None:
    """Greedy tokens from the native argmax: ties (the first wins), lengths around its 16-value steps, a NaN (torch's
    answer, its first NaN), rows of -inf, and a vocabulary's size."""
    for v in (1, 15, 16, 17, 33, 49152):
        x = rand(4, v)
        ties = torch.randint(0, 3, (4, v), generator=gen).float()
        assert torch.equal(ops.argmax_rows(x), x.argmax(dim=-1)) and torch.equal(ops.argmax_rows(ties), ties.argmax(-1))
    x = rand(4, 1000)
    x[0, 999], x[1, 500], x[1, 700], x[2] = float("inf"), float("nan"), float("nan"), float("-inf")
    x[3], x[3, 995] = float("-inf"), -1e30
    assert ops.argmax_rows(x).tolist() == x.argmax(dim=-1).tolist() == [999, 500, 0, 995]


def test_logsumexp_rows_is_torchs_with_its_nan_and_infinities() -> None:
    x = rand(6, 1003) * 3  # a ragged last block of 8
    x[1, 100:], x[2], x[3, 9], x[4, 3], x[5, 7] = float("-inf"), float("-inf"), float("nan"), float("inf"), -1e30
    torch.testing.assert_close(ops.logsumexp_rows(x), torch.logsumexp(x, dim=-1, keepdim=True), equal_nan=True)


def test_top_rows_are_topks_with_ties_by_id_and_dropped_tokens_last() -> None:
    x = torch.randint(0, 6, (5, 1003)).float()  # many ties; a ragged last block of 8
    x[3, 40:] = float("-inf")  # fewer finite values than k: the -inf ones follow, by id
    for k in (1, 50, 400):
        values, ids, done = ops.top_rows(x, k)
        assert bool(done.all())
        for r in range(5):
            order = sorted(range(1003), key=lambda j: (-x[r, j].item(), j))[:k]
            assert ids[r].tolist() == order and torch.equal(values[r], x[r, order])
    x[2, 9] = float("nan")
    assert ops.top_rows(x, 10)[2].tolist() == [True, True, False, True, True]


def test_top_rows_from_a_sampled_threshold_and_when_it_lies_too_high() -> None:
    """Long rows at a large k start from a threshold sampled from every 64th block of 8: the k largest are exact, ties
    by id, also where the sample holds the row's largest values (too few lie above its estimate: collected again)."""
    g = torch.Generator().manual_seed(7)
    x = torch.randint(0, 60, (3, 40_003), generator=g).float()  # many ties; a ragged last block
    x[1] = torch.randn(40_003, generator=g) * 3
    x[2] = torch.randn(40_003, generator=g)
    x[2].view(-1)[: 40_000].view(-1, 8)[::64] += 100.0  # the sampled blocks hold every large value
    for k in (256, 1024):
        values, ids, done = ops.top_rows(x, k)
        assert bool(done.all())
        for r in range(3):
            order = np.lexsort((np.arange(x.shape[1]), -x[r].numpy()))[:k].tolist()  # value descending, then id
            assert ids[r].tolist() == order and torch.equal(values[r], x[r, order])


def test_sampling_walks_the_rows_mass_across_its_chunks() -> None:
    """The token at u is the first whose running mass passes u of the row's, over a row of many chunks of 512."""
    x = torch.randn(2, 3 * 512 + 5, generator=torch.Generator().manual_seed(3)) * 2
    x[1, :700] = float("-inf")  # the first chunk keeps nothing
    cdf = torch.softmax(x.double(), dim=-1).cumsum(-1)
    for u in torch.linspace(0.01, 0.99, 40, dtype=torch.float64):
        got = ops.sample_rows(x, torch.full((2,), float(u), dtype=torch.float64))
        assert got.tolist() == torch.searchsorted(cdf, torch.full((2, 1), float(u), dtype=torch.float64),
                                                  right=True).flatten().tolist()


def test_sampling_leaves_rows_with_a_nan_an_inf_or_nothing_kept_to_the_caller() -> None:
    x = torch.zeros(4, 20)
    x[1, 4], x[2], x[3, 0] = float("nan"), float("-inf"), float("inf")
    assert ops.sample_rows(x, torch.full((4,), 0.5, dtype=torch.float64)).tolist() == [10, -1, -1, -1]


def test_sampling_reads_the_rows_it_is_given_at_their_temperature() -> None:
    """Row i is x[rows[i]]; a temperature flattens its softmax: tokens 0 and 1 at 1/4 and 3/4 (u = 0.4 takes 1), at
    temperature 1e6 near 1/2 each (u = 0.4 takes 0)."""
    x = torch.full((3, 10), float("-inf"))
    x[1, :2] = torch.tensor([0.0, math.log(3.0)])
    x[0, 7] = x[2, 9] = 0.0
    u = torch.full((4,), 0.4, dtype=torch.float64)
    rows = torch.tensor([1, 2, 1, 0])
    assert ops.sample_rows(x, u, rows).tolist() == [1, 9, 1, 7]
    temperature = torch.tensor([1e6, 1e6, 1.0, 0.5])
    assert ops.sample_rows(x, u, rows, temperature).tolist() == [0, 9, 1, 7]


def test_top_k_and_logsumexp_read_the_rows_they_are_given_at_their_temperature() -> None:
    """As over the rows' divided copy: the same candidates and values, the same logsumexp up to its summation."""
    x = torch.randn(6, 1003, generator=torch.Generator().manual_seed(5)) * 4
    rows, temperature = torch.tensor([4, 0, 4, 2]), torch.tensor([[0.7], [1.0], [1.9], [0.3]])
    copy = x[rows] / temperature
    values, ids, done = ops.top_rows(x, 40, rows, temperature)
    want_values, want_ids = copy.topk(40, dim=-1)
    assert bool(done.all()) and torch.equal(ids, want_ids) and torch.equal(values, want_values)
    torch.testing.assert_close(ops.logsumexp_rows(x, rows, temperature), torch.logsumexp(copy, dim=-1, keepdim=True))
