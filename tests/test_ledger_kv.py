"""KV bytes and capacity: the textbook worked example, reproduced exactly, and the engine-facing layout."""
from __future__ import annotations

import pytest

from tally.errors import ConfigError
from tally.ledger.capacity import (
    max_concurrency,
    max_len_for_concurrency,
    memory_budget,
    oversubscription_warning,
)
from tally.ledger.kv import KVLayout, auto_kv_dtype
from tally.ledger.weights import DTYPE_BYTES
from tally.units import GiB, KiB, MiB

# The textbook: 32 layers, 32 heads of 128, 7B params in fp16, 4,096-token requests, an 80 GB card.
TEXTBOOK = dict(num_layers=32, head_dim=128, kv_dtype="fp16")
CARD_BYTES = 80 * GiB  # device memory is binary: an "80 GB" card holds 80 GiB
WEIGHT_BYTES = 7_000_000_000 * DTYPE_BYTES["float16"]  # 14 GB
RESERVE_BYTES = 12 * GiB


def test_textbook_kv_bytes_per_token_and_per_request():
    layout = KVLayout(num_kv_heads=32, **TEXTBOOK)
    assert layout.bytes_per_token == 2 * 32 * 32 * 128 * 2 == 524_288 == 512 * KiB
    assert layout.bytes_for_tokens(4096) == 2 * GiB
    assert WEIGHT_BYTES == 14e9


def test_textbook_80gb_card_fits_27_requests_of_4096_tokens():
    layout = KVLayout(num_kv_heads=32, **TEXTBOOK)
    budget = memory_budget(layout, device_bytes=CARD_BYTES, weight_bytes=WEIGHT_BYTES, reserve_bytes=RESERVE_BYTES)
    assert budget.kv_pool_bytes == 80 * GiB - 14_000_000_000 - 12 * GiB  # 54.96 GiB, the textbook's "54 GB"
    assert max_concurrency(layout, budget.kv_blocks, 4096) == 27


def test_textbook_gqa_with_8_kv_heads_gives_4x_the_concurrency():
    mha, gqa = KVLayout(num_kv_heads=32, **TEXTBOOK), KVLayout(num_kv_heads=8, **TEXTBOOK)
    assert gqa.bytes_per_token == 128 * KiB == mha.bytes_per_token // 4
    assert gqa.bytes_for_tokens(4096) == 512 * MiB
    kwargs = dict(device_bytes=CARD_BYTES, weight_bytes=WEIGHT_BYTES, reserve_bytes=RESERVE_BYTES)
    mha_budget, gqa_budget = memory_budget(mha, **kwargs), memory_budget(gqa, **kwargs)
    assert gqa_budget.kv_tokens == 4 * mha_budget.kv_tokens
    mha_fit = max_concurrency(mha, mha_budget.kv_blocks, 4096)
    gqa_fit = max_concurrency(gqa, gqa_budget.kv_blocks, 4096)
    assert (mha_fit, gqa_fit) == (27, 109)
    assert gqa_fit // mha_fit == 4


def test_int8_kv_block_is_int8_values_plus_one_fp32_scale_per_layer_kv_token_head():
    layout = KVLayout(num_layers=30, num_kv_heads=3, head_dim=64, kv_dtype="int8", block_size=16)
    values = 16 * 2 * 30 * 3 * 64 * 1
    scales = 16 * 2 * 30 * 3 * 4
    assert layout.bytes_per_block == values + scales
    assert layout.bytes_per_token == (values + scales) // 16
    fp8 = KVLayout(num_layers=30, num_kv_heads=3, head_dim=64, kv_dtype="fp8", block_size=16)
    assert fp8.bytes_per_block == values + 2 * 30 * 3 * 4  # planned for GPUs: a scale per block


def test_engine_layout_accepts_long_and_short_dtype_names():
    long_name = KVLayout(num_layers=30, num_kv_heads=3, head_dim=64, kv_dtype="bfloat16", block_size=16)
    short_name = KVLayout(num_layers=30, num_kv_heads=3, head_dim=64, kv_dtype="bf16", block_size=16)
    assert long_name == short_name
    assert long_name.bytes_per_token == 2 * 30 * 3 * 64 * 2 == 23_040
    assert long_name.bytes_per_block == 16 * 23_040
    assert KVLayout(num_layers=1, num_kv_heads=1, head_dim=8, kv_dtype="float32").bytes_per_token == 2 * 8 * 4
    with pytest.raises(ConfigError, match="KV cache dtype"):
        KVLayout(num_layers=1, num_kv_heads=1, head_dim=8, kv_dtype="int3")


def test_num_blocks_for_budget_counts_whole_blocks_only():
    layout = KVLayout(num_layers=30, num_kv_heads=3, head_dim=64, kv_dtype="bfloat16", block_size=16)
    assert layout.num_blocks_for_budget(10 * layout.bytes_per_block - 1) == 9
    assert layout.num_blocks_for_budget(10 * layout.bytes_per_block) == 10
    assert layout.num_blocks_for_budget(-5) == 0


def test_concurrency_times_length_beyond_the_pool_warns_with_what_fits():
    layout = KVLayout(num_kv_heads=32, **TEXTBOOK)
    budget = memory_budget(layout, device_bytes=CARD_BYTES, weight_bytes=WEIGHT_BYTES, reserve_bytes=RESERVE_BYTES)
    assert oversubscription_warning(layout, budget, concurrency=27, max_len=4096) is None
    warning = oversubscription_warning(layout, budget, concurrency=64, max_len=4096)
    assert "only 27 fit" in warning
    longest = max_len_for_concurrency(layout, budget.kv_blocks, 64)
    assert f"{longest:,}" in warning
    assert max_concurrency(layout, budget.kv_blocks, longest) >= 64


def test_auto_kv_dtype_halves_fp32_caches_only_over_quantized_weights():
    assert auto_kv_dtype("float32", quantized=True) == "float16"  # a GGUF's blocks as stored, as llama.cpp keeps it
    assert auto_kv_dtype("float32", quantized=False) == "float32"  # the oracle's arithmetic
    assert auto_kv_dtype("bfloat16", quantized=True) == auto_kv_dtype("bfloat16", quantized=False) == "bfloat16"
