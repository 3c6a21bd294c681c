"""The roofline: decode bound by bytes read per step, prefill by FLOPs."""
from __future__ import annotations

import pytest

from tally.ledger.roofline import ModelCost, decode_step, prefill_seconds

TEXTBOOK = ModelCost(weight_bytes=14_000_000_000, matmul_params=7_000_000_000,
                     attention_width=32 * 32 * 128, kv_bytes_per_token=524_288)


def test_textbook_decode_14gb_at_2tbs_is_7ms_and_about_140_tokens_per_s():
    est = decode_step(TEXTBOOK, concurrency=1, context_tokens=0, bandwidth_bytes_per_s=2e12, flops_per_s=1e15)
    assert est.ms_per_token == pytest.approx(7.0)
    assert est.tokens_per_s == pytest.approx(1000 / 7)  # 142.9, "about 140"
    assert est.bound == "memory"


def test_decode_reads_each_requests_kv_cache_every_step():
    one = decode_step(TEXTBOOK, concurrency=1, context_tokens=4096, bandwidth_bytes_per_s=2e12, flops_per_s=1e15)
    assert one.bytes_per_step == 14e9 + 4096 * 524_288
    eight = decode_step(TEXTBOOK, concurrency=8, context_tokens=4096, bandwidth_bytes_per_s=2e12, flops_per_s=1e15)
    assert eight.bytes_per_step == 14e9 + 8 * 4096 * 524_288
    assert eight.tokens_per_s == pytest.approx(8 / eight.step_s)
    assert eight.tokens_per_s > one.tokens_per_s  # batching shares the weight read


def test_large_batch_decode_becomes_compute_bound():
    est = decode_step(TEXTBOOK, concurrency=4096, context_tokens=0, bandwidth_bytes_per_s=2e12, flops_per_s=312e12)
    assert est.bound == "compute"
    assert est.step_s == pytest.approx(4096 * 2 * 7e9 / 312e12)


def test_prefill_is_2_flops_per_param_per_token_plus_causal_attention():
    tokens = 2048
    expected_flops = 2 * 7e9 * tokens + 2 * 32 * (32 * 128) * tokens**2
    seconds = prefill_seconds(TEXTBOOK, prompt_tokens=tokens, bandwidth_bytes_per_s=2e12, flops_per_s=1e15)
    assert seconds == pytest.approx(expected_flops / 1e15)
    # A one-token prompt still has to read every weight once.
    assert prefill_seconds(TEXTBOOK, prompt_tokens=1, bandwidth_bytes_per_s=2e12, flops_per_s=1e15) == pytest.approx(7e-3)
