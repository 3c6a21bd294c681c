from __future__ import annotations

import pytest
import torch

import tally.sample.sampler as sampler_module
from tally.outputs import logprob_entry
from tally.sample.batch import SamplerInput
from tally.sample.penalties import PenaltyTensors, apply_penalties
from tally.sample.sampler import Sampler, sample
from tally.sampling_params import SamplingParams

EOS = 2


def make_input(params, outputs=None, prompts=None, eos=None, generators=None) -> SamplerInput:
    n = len(params)
    return SamplerInput(
        params=params,
        generators=generators or [torch.Generator().manual_seed(p.seed) if p.seed is not None else None
                                 for p in params],
        output_token_ids=outputs or [[] for _ in range(n)],
        prompt_token_ids=prompts or [[0] for _ in range(n)],
        eos_token_ids=eos or [(EOS,) for _ in range(n)],
    )


def random_logits(rows: int, vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_takes_the_argmax():
    logits = random_logits(8, 500)
    out = sample(logits, make_input([SamplingParams(temperature=0.0)] * 8))
    assert torch.equal(out.token_ids, logits.argmax(-1))


def test_top_k_1_is_greedy_even_with_temperature_and_penalties():
    logits = random_logits(6, 300)
    outputs = [[5, 7, 7], [], [1], [9, 9], [3], [4]]
    greedy = [SamplingParams(temperature=0.0, repetition_penalty=1.3, frequency_penalty=0.5)] * 6
    top1 = [SamplingParams(temperature=1.7, top_k=1, repetition_penalty=1.3, frequency_penalty=0.5)] * 6
    a = sample(logits, make_input(greedy, outputs=outputs))
    b = sample(logits, make_input(top1, outputs=outputs))
    assert torch.equal(a.token_ids, b.token_ids)


@pytest.mark.parametrize("chunk_rows", [None, 3])
@pytest.mark.parametrize("top_p", [0.95, 1.0])  # 1.0: a plain row, drawn where it lies when all rows are plain
def test_seeded_row_samples_the_same_alone_or_in_a_mixed_batch(chunk_rows, top_p, monkeypatch):
    vocab = 1000
    if chunk_rows:  # the CPU path works through rows in chunks; put the row at a chunk's edge
        monkeypatch.setattr(sampler_module, "_CPU_CHUNK_ELEMENTS", chunk_rows * vocab)
    row = random_logits(1, vocab, seed=1)
    seeded = SamplingParams(temperature=0.9, top_p=top_p, seed=42)

    def run(batch_params, position, steps=6):
        logits = random_logits(len(batch_params), vocab, seed=2)
        logits[position] = row[0]
        sampler = Sampler()
        inp = make_input(batch_params)
        return [int(sampler(logits, inp).token_ids[position]) for _ in range(steps)]

    alone = run([seeded], 0)
    others = [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.5, seed=7),
        seeded,  # the row we follow, at position 3
        SamplingParams(temperature=1.2, top_k=20),
        SamplingParams(temperature=0.8, seed=42, min_p=0.05),
        SamplingParams(temperature=1.0, presence_penalty=1.0),
        SamplingParams(temperature=1.0, seed=3),
    ]
    assert run(others, 3) == alone
    assert run([seeded], 0) == alone  # a fresh generator replays the same sequence
    assert len(set(alone)) > 1  # it really samples
    assert run([seeded, SamplingParams(temperature=0.7), SamplingParams(temperature=0.0)], 0) == alone
    other_seed = run([SamplingParams(temperature=0.9, top_p=top_p, seed=43)], 0)
    assert other_seed != alone


def sample_many(logits_row: torch.Tensor, params: SamplingParams, rows: int = 256, rounds: int = 4):
    """The set of tokens drawn from one distribution, rows x rounds times."""
    logits = logits_row.expand(rows, -1).contiguous()
    sampler, inp = Sampler(), make_input([params] * rows)
    return {t for _ in range(rounds) for t in sampler(logits, inp).token_ids.tolist()}


def crafted(probs: list[float], vocab: int = 64) -> torch.Tensor:
    """Logits whose softmax puts `probs` on ids 10, 11, ... and ~nothing elsewhere."""
    p = torch.full((vocab,), 1e-9)
    p[10 : 10 + len(probs)] = torch.tensor(probs)
    return p.log()


def test_top_k_keeps_exactly_the_k_most_likely():
    logits = crafted([0.3, 0.25, 0.2, 0.15, 0.1])
    assert sample_many(logits, SamplingParams(top_k=3)) == {10, 11, 12}


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = crafted([0.5, 0.3, 0.15, 0.05])
    assert sample_many(logits, SamplingParams(top_p=0.75)) == {10, 11}
    assert sample_many(logits, SamplingParams(top_p=0.85)) == {10, 11, 12}
    assert sample_many(logits, SamplingParams(top_p=0.4)) == {10}


def test_top_p_renormalises_after_top_k():
    # Among the top 2 (0.4, 0.35) the first holds 53% of the mass, so top_p=0.5 keeps only it.
    logits = crafted([0.4, 0.35, 0.25])
    assert sample_many(logits, SamplingParams(top_k=2, top_p=0.5)) == {10}


def test_top_p_nucleus_larger_than_the_candidate_window_sorts_the_row():
    vocab = 3000
    logits = torch.linspace(0.0, 1.0, vocab)  # nearly flat: the 0.5 nucleus holds ~1300 tokens
    probs = logits.softmax(-1)
    order = probs.argsort(descending=True)
    mass_before = probs[order].cumsum(0) - probs[order]
    allowed = set(order[mass_before < 0.5].tolist())
    assert len(allowed) > 1024
    got = sample_many(logits, SamplingParams(top_p=0.5), rows=256, rounds=8)
    assert got <= allowed and len(got) > 500


def test_min_p_drops_tokens_below_a_fraction_of_the_top_probability():
    logits = crafted([0.5, 0.3, 0.1, 0.06, 0.04])
    assert sample_many(logits, SamplingParams(min_p=0.15)) == {10, 11, 12}
    # with top-k, min-p applies to the candidates found in place; then top-k, then top-p over what is left
    assert sample_many(logits, SamplingParams(min_p=0.15, top_k=4)) == {10, 11, 12}
    assert sample_many(logits, SamplingParams(min_p=0.15, top_k=2)) == {10, 11}
    assert sample_many(logits, SamplingParams(min_p=0.15, top_k=4, top_p=0.75)) == {10, 11}
    assert sample_many(logits, SamplingParams(min_p=0.7, top_k=4, temperature=0.5)) == {10}


def test_penalties_match_the_formulas():
    vocab = 20
    logits = random_logits(5, vocab)
    params = [
        SamplingParams(repetition_penalty=1.5, frequency_penalty=0.3, presence_penalty=0.2),
        SamplingParams(),  # untouched
        SamplingParams(repetition_penalty=0.8, presence_penalty=-0.5),  # no output yet
        SamplingParams(repetition_penalty=1.2, frequency_penalty=-1.0),  # empty prompt
        SamplingParams(repetition_penalty=1.2),  # nothing seen at all
    ]
    prompts = [[1, 2, 3], [1, 2], [6, 6, 7], [], []]
    outputs = [[3, 4, 4, 5, 4], [4, 4], [], [9, 8, 9], []]
    expected = logits.clone()
    for row, (p, prompt, out) in enumerate(zip(params, prompts, outputs)):
        for tok in set(prompt) | set(out):
            value = expected[row, tok]
            rep = p.repetition_penalty
            expected[row, tok] = value / rep if value > 0 else value * rep
        for tok in set(out):
            expected[row, tok] -= p.frequency_penalty * out.count(tok) + p.presence_penalty
    got = logits.clone()
    apply_penalties(got, PenaltyTensors.build(params, prompts, got.device), outputs)
    torch.testing.assert_close(got, expected)


def test_min_tokens_masks_eos_and_stop_tokens_until_reached():
    logits = torch.zeros(3, 10)
    logits[:, EOS] = 10.0
    logits[:, 7] = 9.0
    params = [
        SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=[7]),
        SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=[7]),
        SamplingParams(temperature=0.0, min_tokens=3, ignore_eos=True),
    ]
    outputs = [[1], [1, 1, 1], [1]]
    out = sample(logits, make_input(params, outputs=outputs, eos=[(EOS,), (EOS,), ()]))
    assert out.token_ids[0] not in (EOS, 7)
    assert out.token_ids[1] == EOS  # min_tokens reached
    assert out.token_ids[2] == EOS  # ignore_eos: EOS is not a stop token, so not masked


def test_chosen_logprob_is_log_softmax_of_the_raw_logits():
    logits = random_logits(5, 400)
    params = [
        SamplingParams(temperature=0.0, repetition_penalty=2.0, logprobs=0),
        SamplingParams(temperature=0.7, top_k=10),
        SamplingParams(temperature=1.3, top_p=0.8, seed=1),
        SamplingParams(min_p=0.2, frequency_penalty=1.0),
        SamplingParams(),
    ]
    out = sample(logits, make_input(params, outputs=[[1, 2]] * 5))
    expected = logits.log_softmax(-1).gather(1, out.token_ids[:, None]).squeeze(1)
    torch.testing.assert_close(out.logprobs, expected)


def test_a_batch_that_asked_for_no_logprobs_gets_none_computed():
    """No logsumexp over the vocabulary when no row asked (cumulative_logprob is only reported with logprobs)."""
    out = sample(random_logits(3, 400), make_input([SamplingParams(temperature=0.0), SamplingParams(),
                                                    SamplingParams(top_k=5)]))
    assert out.logprobs.tolist() == [0.0, 0.0, 0.0] and out.top_logprobs is None and out.ranks is None


def test_top_logprobs_are_sorted_with_right_ranks():
    logits = random_logits(4, 300)
    params = [SamplingParams(temperature=0.0, logprobs=5), SamplingParams(logprobs=3), SamplingParams(),
              SamplingParams(logprobs=0)]
    out = sample(logits, make_input(params))
    ids, values = out.top_logprobs
    ref_values, ref_ids = logits.log_softmax(-1).topk(5, dim=-1)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(values, ref_values)
    assert torch.all(values[:, :-1] >= values[:, 1:])
    assert out.ranks[0] == 1  # greedy picks the top token
    for row in (1, 3):
        chosen = logits[row, out.token_ids[row]]
        assert out.ranks[row] == int((logits[row] > chosen).sum()) + 1
    def entry(row: int, k: int) -> dict:
        return logprob_entry(int(out.token_ids[row]), float(out.logprobs[row]), int(out.ranks[row]),
                             ids[row, :k].tolist(), values[row, :k].tolist())

    first = entry(1, 3)
    assert int(out.token_ids[1]) in first and set(ref_ids[1, :3].tolist()) <= set(first)
    assert [first[t].rank for t in ref_ids[1, :3].tolist()] == [1, 2, 3]
    assert list(entry(3, 0)) == [int(out.token_ids[3])]


def test_sampler_reuses_its_tensors_while_the_batch_is_unchanged():
    params = [SamplingParams(top_k=5, seed=1), SamplingParams(temperature=0.0)]
    inp = make_input(params)
    sampler = Sampler()
    sampler(random_logits(2, 50), inp)
    first = sampler._tensors
    sampler(random_logits(2, 50, seed=1), inp)
    assert sampler._tensors is first
    sampler(random_logits(1, 50), make_input(params[:1]))
    assert sampler._tensors is not first


@pytest.mark.parametrize("native", [True, False])
def test_draws_tokens_with_the_softmax_probabilities(native, monkeypatch):
    """The native kernel and the torch form of `draw` (GPU, or no kernels) alike."""
    if not native:
        monkeypatch.setattr(sampler_module.ops, "available", lambda: False)
    probs = [0.5, 0.3, 0.15, 0.05]
    logits = crafted(probs).expand(4096, -1).contiguous() * 0.5  # temperature 0.5 undoes the halving
    out = sample(logits, make_input([SamplingParams(temperature=0.5)] * 4096))
    freq = torch.bincount(out.token_ids, minlength=64)[10:14].float() / 4096
    torch.testing.assert_close(freq, torch.tensor(probs), atol=0.03, rtol=0)


@pytest.mark.parametrize("native", [True, False])
def test_draw_walks_the_kept_tokens_in_order(native, monkeypatch):
    """u = 0 takes the first kept token, u near 1 the last; dropped (-inf) tokens never, a ragged vocabulary's
    last tokens too."""
    if not native:
        monkeypatch.setattr(sampler_module.ops, "available", lambda: False)
    logits = torch.full((3, 1003), float("-inf"))
    logits[:, [7, 500, 1001]] = torch.tensor([1.0, 3.0, 2.0])
    u = torch.tensor([0.0, 0.5, 1 - 1e-12], dtype=torch.float64)
    assert sampler_module.draw(logits, u).tolist() == [7, 500, 1001]


@pytest.mark.parametrize("native", [True, False])
def test_top_k_rows_found_in_place_leave_a_nan_row_to_torch(native, monkeypatch):
    """Unseeded top-k / top-p rows take their candidates where the rows lie; a row holding a NaN is torch's there,
    and the others keep their top-k."""
    if not native:
        monkeypatch.setattr(sampler_module.ops, "available", lambda: False)
    logits = random_logits(4, 300, seed=3)
    logits[2, 7] = float("nan")
    params = [SamplingParams(temperature=0.8, top_k=3), SamplingParams(temperature=1.5, top_p=0.5, top_k=5)] * 2
    out = sample(logits, make_input(params))
    for r in (0, 1, 3):
        assert int(out.token_ids[r]) in logits[r].topk(params[r].top_k).indices.tolist()


def test_logit_bias_and_allowed_token_ids_steer_each_row_alone():
    logits = torch.zeros(3, 10)
    logits[:, 2] = 5.0  # every row's argmax is token 2
    params = [SamplingParams(temperature=0.0, logit_bias={7: 100.0}),  # bias wins over 5
              SamplingParams(temperature=0.0, allowed_token_ids=[4, 9]),
              SamplingParams(temperature=0.0, logprobs=0)]
    inp = SamplerInput(params=params, generators=[None] * 3, output_token_ids=[[]] * 3, prompt_token_ids=[[1]] * 3,
                       eos_token_ids=[()] * 3)
    out = sample(logits, inp)
    assert out.token_ids.tolist()[0] == 7 and out.token_ids.tolist()[1] in (4, 9) and out.token_ids.tolist()[2] == 2
    assert float(out.logprobs[2]) == pytest.approx(float(torch.log_softmax(logits[2], -1)[2]), abs=1e-5)  # raw
