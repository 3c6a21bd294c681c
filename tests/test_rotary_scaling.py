"""Tally's rotary scalings against transformers' own (modeling_rope_utils) on the same settings: the inverse
frequencies and the factor cos and sin are scaled by."""
from __future__ import annotations

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from tally.layers.rotary import inverse_frequencies

YARN = dict(rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0, original_max_position_embeddings=4096)


@pytest.mark.parametrize("scaling", [
    YARN | {"truncate": False},  # GPT-OSS
    YARN,  # Qwen2.5's long-context setting: the correction range rounded out
    YARN | {"mscale": 1.0, "mscale_all_dim": 0.707},
    YARN | {"attention_factor": 1.25, "beta_fast": 16.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048},
])
def test_yarn_matches_transformers(scaling):
    config = transformers.Qwen2Config(hidden_size=512, num_attention_heads=8, max_position_embeddings=131072,
                                      rope_parameters=dict(scaling, rope_theta=150000.0))
    expected, expected_scale = ROPE_INIT_FUNCTIONS["yarn"](config)
    inv_freq, scale = inverse_frequencies(64, 150000.0, scaling, 131072)
    torch.testing.assert_close(inv_freq, expected, rtol=0, atol=0)
    assert scale == pytest.approx(expected_scale, rel=1e-12)
