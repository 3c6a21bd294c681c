"""Rejection sampling against a draft's distribution q gives the target's distribution p, whatever q; and the
distribution a sampler reports for a row is the one it samples from."""
from __future__ import annotations

import torch

from tally.sample.batch import DraftRows, SamplerInput
from tally.sample.rejection import rejection_sample
from tally.sample.sampler import Sampler
from tally.sampling_params import SamplingParams


def _inputs(params: list[SamplingParams], draft: DraftRows | None = None) -> SamplerInput:
    n = len(params)
    return SamplerInput(params=params, generators=[None] * n, output_token_ids=[[] for _ in range(n)],
                        prompt_token_ids=[[0] for _ in range(n)], eos_token_ids=[() for _ in range(n)], draft=draft)


def test_accepted_or_resampled_tokens_are_distributed_as_the_target():
    torch.manual_seed(0)
    p = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
    q = torch.tensor([0.1, 0.1, 0.2, 0.3, 0.3])  # mass where p has little or none
    n = 200_000
    proposals = torch.multinomial(q, n, replacement=True)
    out = rejection_sample(p.expand(n, -1).clone(), q.expand(n, -1).clone(), proposals,
                           torch.multinomial(p, n, replacement=True))
    frequencies = torch.bincount(out, minlength=5).float() / n
    assert torch.allclose(frequencies, p, atol=0.005), frequencies
    kept = (out == proposals).float().mean()
    assert abs(kept - torch.minimum(p, q).sum()) < 0.005  # acceptance is sum(min(p, q))


def test_a_point_mass_draft_is_accepted_with_the_targets_probability():
    torch.manual_seed(1)
    p = torch.tensor([0.6, 0.3, 0.1])
    n = 100_000
    out = rejection_sample(p.expand(n, -1).clone(), torch.tensor([0.0, 1.0, 0.0]).expand(n, -1).clone(),
                           torch.ones(n, dtype=torch.long), torch.multinomial(p, n, replacement=True))
    assert abs((out == 1).float().mean() - 0.3) < 0.01
    assert abs((out == 0).float().mean() - 0.6) < 0.01


def test_the_reported_distribution_is_the_one_sampled_from():
    torch.manual_seed(2)
    logits = torch.randn(3, 50) * 2
    params = [SamplingParams(temperature=0.7, top_k=5), SamplingParams(temperature=1.3, top_p=0.8),
              SamplingParams(temperature=0.0)]
    probs = Sampler().distribution(logits, _inputs(params))
    top5 = torch.softmax(logits[0] / 0.7, -1).topk(5)
    expected = torch.zeros(50).index_put_((top5.indices,), top5.values / top5.values.sum())
    assert torch.allclose(probs[0], expected, atol=1e-5)
    assert torch.allclose(probs[1].sum(), torch.tensor(1.0)) and (probs[1] > 0).sum() < 50
    assert probs[2].argmax() == logits[2].argmax() and probs[2].max() == 1.0
    sampler, counts = Sampler(), torch.zeros(50)
    for _ in range(4000):
        counts[sampler(logits[1:2], _inputs(params[1:2])).token_ids[0]] += 1
    assert torch.allclose(counts / 4000, probs[1], atol=0.03)


def test_draft_rows_keep_a_proposal_the_target_is_sure_of_and_replace_one_it_rules_out():
    logits = torch.full((2, 10), -20.0)
    logits[0, 3] = logits[1, 4] = 20.0  # the target is sure of token 3 in row 0 and of token 4 in row 1
    q = torch.full((2, 10), 0.1)
    draft = DraftRows(torch.tensor([0, 1]), torch.tensor([3, 7]), q)
    out = Sampler()(logits, _inputs([SamplingParams(temperature=1.0)] * 2, draft))
    assert out.token_ids.tolist() == [3, 4]
    assert out.logprobs.tolist() == [0.0, 0.0]  # the logprobs are the kept tokens'
