"""The engine's start-up ledger and the CPU probe behind `--device cpu`."""
from __future__ import annotations

import json

from tally.ledger.hardware import measure_matmul_flops, measure_read_bandwidth
from tally.ledger.kv import KVLayout
from tally.ledger.report import EngineLedger
from tally.platform import total_ram_bytes


def _ledger(kv_blocks: int, max_num_seqs: int) -> EngineLedger:
    layout = KVLayout(num_layers=30, num_kv_heads=3, head_dim=64, kv_dtype="bfloat16", block_size=16)
    return EngineLedger(model_name="SmolLM2-135M", weight_bytes=96_576_768, kv_blocks=kv_blocks, block_size=16,
                        kv_bytes_per_token=layout.bytes_per_token, kv_pool_bytes=kv_blocks * layout.bytes_per_block,
                        reserve_bytes=1 << 30, max_model_len=8192, max_num_seqs=max_num_seqs)


def test_engine_ledger_derives_tokens_and_concurrency_from_blocks():
    ledger = _ledger(kv_blocks=2048, max_num_seqs=4)
    assert ledger.kv_tokens == 2048 * 16
    assert ledger.max_concurrency_at_max_len == 2048 // (8192 // 16) == 4
    data = json.loads(json.dumps(ledger.to_dict()))
    assert data["kv_tokens"] == 32_768 and data["max_concurrency_at_max_len"] == 4
    assert data["kv_bytes_per_token"] == 23_040
    text = ledger.format()
    assert "2,048 blocks x 16 tokens = 32,768 tokens" in text
    assert "exceeds" not in text


def test_engine_ledger_says_when_max_num_seqs_cannot_all_be_long():
    text = _ledger(kv_blocks=1024, max_num_seqs=64).format()
    assert "2 request(s) of max_model_len 8,192" in text
    assert "max_num_seqs 64 x max_model_len 8,192 exceeds the KV pool" in text


def test_cpu_probe_measures_positive_bandwidth_flops_and_ram():
    assert measure_read_bandwidth(16 << 20, repeats=2) > 1e8
    assert measure_matmul_flops(256, repeats=2) > 1e8
    assert total_ram_bytes() > 1 << 30
