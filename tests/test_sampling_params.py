from __future__ import annotations

import pytest

from tally.errors import InvalidRequestError
from tally.sampling_params import SamplingParams, SamplingType


@pytest.mark.parametrize(
    "kwargs, param",
    [
        (dict(temperature=-0.1), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.01), "top_p"),
        (dict(top_k=-2), "top_k"),
        (dict(min_p=-0.1), "min_p"),
        (dict(min_p=1.5), "min_p"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(max_tokens=-3), "max_tokens"),
        (dict(n=0), "n"),
        (dict(n=1, best_of=3), "best_of"),
        (dict(presence_penalty=2.5), "presence_penalty"),
        (dict(frequency_penalty=-2.1), "frequency_penalty"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(logprobs=-1), "logprobs"),
        (dict(logprobs=2.5), "logprobs"),
        (dict(prompt_logprobs=-2), "prompt_logprobs"),
        (dict(stop=""), "stop"),
        (dict(stop=["ok", ""]), "stop"),
        (dict(min_tokens=-1), "min_tokens"),
        (dict(min_tokens=5, max_tokens=4), "min_tokens"),
        (dict(stop_token_ids=[-1]), "stop_token_ids"),
    ],
)
def test_bad_value_raises_invalid_request_naming_the_parameter(kwargs, param):
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(**kwargs)
    assert err.value.param == param
    assert param in str(err.value)
    assert isinstance(err.value, ValueError)


def test_defaults_match_vllm():
    p = SamplingParams()
    assert (p.n, p.temperature, p.top_p, p.top_k, p.min_p, p.max_tokens) == (1, 1.0, 1.0, 0, 0.0, 16)
    assert p.stop == [] and p.stop_token_ids == [] and p.logprobs is None
    assert p.sampling_type == SamplingType.RANDOM


def test_stop_string_is_normalised_to_a_list():
    assert SamplingParams(stop="###").stop == ["###"]
    assert SamplingParams(stop=("a", "b")).stop == ["a", "b"]


def test_max_tokens_zero_is_accepted_only_to_score_a_prompt():
    assert SamplingParams(max_tokens=0, prompt_logprobs=1).max_tokens == 0
    assert SamplingParams(max_tokens=None).max_tokens is None


def test_best_of_equal_to_n_and_both_top_k_off_values_are_accepted():
    SamplingParams(n=2, best_of=2)
    SamplingParams(top_k=-1)
    SamplingParams(top_k=0)


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        (dict(temperature=0.0), SamplingType.GREEDY),
        (dict(temperature=0.0, seed=1), SamplingType.GREEDY),
        (dict(top_k=1, temperature=0.8), SamplingType.GREEDY),
        (dict(temperature=0.7, seed=3), SamplingType.RANDOM_SEED),
        (dict(temperature=0.7, top_k=-1), SamplingType.RANDOM),
    ],
)
def test_sampling_type(kwargs, expected):
    assert SamplingParams(**kwargs).sampling_type == expected
