"""top-k / top-p / min-p cutoffs against vLLM's sort-based reference, including nuclei wider than
the candidate window (the bisection path)."""
from __future__ import annotations

import math

import pytest
import torch

from tally.sample.filters import apply_min_p, top_k_top_p


def vllm_reference(logits: torch.Tensor, k: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """vLLM's apply_top_k_top_p (ascending sort, top-k mask, then top-p on the survivors)."""
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    top_k_mask = logits_sort.gather(1, (logits_sort.size(1) - k).unsqueeze(1))
    logits_sort.masked_fill_(logits_sort < top_k_mask, -float("inf"))
    probs_sum = logits_sort.softmax(dim=-1).cumsum(dim=-1)
    top_p_mask = probs_sum <= 1 - p.unsqueeze(1)
    top_p_mask[:, -1] = False
    logits_sort.masked_fill_(top_p_mask, -float("inf"))
    return logits_sort.scatter(dim=-1, index=logits_idx, src=logits_sort)


@pytest.mark.parametrize("vocab, scale", [(3000, 3.0), (5000, 0.3)])
def test_kept_sets_match_vllm(vocab, scale):
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(12, vocab, generator=gen) * scale
    top_k = torch.tensor([vocab, 5, 50, vocab, vocab, 1, 200, vocab, 40, vocab, 3000, vocab])
    top_p = torch.tensor([0.9, 1.0, 0.8, 0.5, 0.99, 1.0, 0.3, 0.95, 1.0, 0.7, 0.9, 1.0])
    # As FilterTensors.num_candidates: the largest top-k, and 1024 for top-p rows without one.
    num_candidates = min(vocab, max(1024, int(top_k[top_k < vocab].max())))
    cand = top_k_top_p(logits, top_k, top_p, num_candidates)
    kept = logits >= cand.cutoff
    expected = vllm_reference(logits, top_k, top_p) > -math.inf
    assert torch.equal(kept, expected)
    # Flat rows at scale 0.3 have nuclei far wider than 1024 tokens: those went through bisection.
    assert cand.complete is False


def test_candidates_hold_every_kept_token_when_complete():
    logits = torch.randn(4, 2000, generator=torch.Generator().manual_seed(1)) * 4
    top_k = torch.tensor([10, 2000, 7, 2000])
    top_p = torch.tensor([1.0, 0.6, 0.9, 0.5])
    cand = top_k_top_p(logits, top_k, top_p, num_candidates=1024)
    assert cand.complete
    kept = vllm_reference(logits, top_k, top_p) > -math.inf
    for row in range(4):
        ids = cand.ids[row][cand.values[row] > -math.inf]
        assert set(ids.tolist()) == set(kept[row].nonzero().squeeze(1).tolist())


def test_min_p_keeps_tokens_within_the_ratio_of_the_top():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.1, 0.06, 0.04], [0.2, 0.2, 0.2, 0.2, 0.2]]))
    apply_min_p(logits, torch.log(torch.tensor([[0.15], [0.9]])))
    assert (logits > -math.inf).tolist() == [[True, True, True, False, False], [True] * 5]
