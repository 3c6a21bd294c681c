"""Plan from the real length distribution: percentiles, the recommended max_model_len, the long tail."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tally.errors import ConfigError
from tally.ledger.capacity import long_tail_plan, max_concurrency
from tally.ledger.kv import KVLayout
from tally.ledger.length_percentiles import load_lengths, summarize
from tally.traces import SHIPPED_TRACES

PAIRS = [(100 * i, 10 * i) for i in range(1, 10)] + [(5000, 1000)]  # totals 110..990 and one 6,000
AZURE_CONV = SHIPPED_TRACES["conv"]


def _write_trace(path: Path, pairs: list[tuple[int, int]]) -> Path:
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    lines += [f"2023-11-16 18:15:{i % 60:02d}.0000000,{p},{o}" for i, (p, o) in enumerate(pairs)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def azure_style_csv(tmp_path) -> Path:
    return _write_trace(tmp_path / "trace.csv", PAIRS)


def test_percentiles_of_a_small_trace_use_nearest_rank(azure_style_csv):
    stats = summarize(load_lengths(azure_style_csv))
    assert stats.num_requests == 10
    # totals sorted: 110, 220, ..., 990, 6000; rank = ceil(p/100 * 10)
    assert stats.total_tokens == {"p50": 550, "p90": 990, "p99": 6000, "p99.5": 6000, "max": 6000}
    assert stats.prompt_tokens["p50"] == 500 and stats.output_tokens["max"] == 1000
    assert stats.share_longer_than(990) == pytest.approx(0.1)


def test_long_tail_pool_takes_what_the_recommended_length_leaves_out(azure_style_csv):
    stats = summarize(load_lengths(azure_style_csv))
    layout = KVLayout(num_layers=2, num_kv_heads=1, head_dim=8, kv_dtype="fp32", block_size=16)
    plan = long_tail_plan(layout, kv_blocks=1000, stats=stats, percentile=90, theoretical_max_len=8192,
                          main_concurrency=10)
    assert plan.max_model_len == 992  # p90 = 990, rounded up to whole blocks
    assert plan.concurrency_at_max_model_len == 1000 // 62 == max_concurrency(layout, 1000, 992)
    assert plan.concurrency_at_theoretical_max_len == 1000 // 512
    assert plan.tail_request_share == pytest.approx(0.1)
    slot_share = 1000 / (450 + 1000)  # the long request decodes 1,000 of the 1,450 output tokens
    assert plan.tail_slot_share == pytest.approx(slot_share)
    assert plan.tail_max_len == 6000
    assert plan.tail_concurrency == -(-10 * slot_share // (1 - slot_share))  # ceil
    assert plan.tail_pool_bytes == plan.tail_concurrency * layout.bytes_for_tokens(6000)


def test_bench_result_and_jsonl_records_are_read(tmp_path):
    records = [{"prompt_tokens": p, "output_tokens": o, "ttft_s": 0.1} for p, o in PAIRS]
    records.append({"prompt_tokens": 7, "output_tokens": None, "error": "timeout"})  # failed: skipped
    bench = tmp_path / "result.json"
    summary = {"requests": 11, "prompt_tokens": 99_999, "output_tokens": 9_999}  # totals, not a request
    bench.write_text(json.dumps({"summary": summary, "requests": records}))
    jsonl = tmp_path / "lengths.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in records))
    assert load_lengths(bench) == PAIRS
    assert load_lengths(jsonl) == PAIRS
    one_line = tmp_path / "one.jsonl"
    one_line.write_text(json.dumps(records[0]))
    assert load_lengths(one_line) == PAIRS[:1]


def test_a_file_without_length_columns_is_refused(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError, match="ContextTokens,GeneratedTokens"):
        load_lengths(bad)
    with pytest.raises(ConfigError, match="no lengths file"):
        load_lengths(tmp_path / "missing.csv")


def test_azure_conversation_trace_percentiles_match_a_plain_sort(tmp_path):
    if AZURE_CONV.is_file():
        path = AZURE_CONV
    else:  # an install without the shipped trace: a same-shaped stand-in
        path = _write_trace(tmp_path / "conv.csv", [(37 * i % 4000 + 1, 13 * i % 700 + 1) for i in range(2000)])
    with open(path, newline="") as f:
        totals = sorted(int(r["ContextTokens"]) + int(r["GeneratedTokens"]) for r in csv.DictReader(f))
    stats = summarize(load_lengths(path))
    assert stats.num_requests == len(totals)
    assert stats.total_tokens["p50"] == totals[-(-len(totals) // 2) - 1]
    assert stats.total_tokens["max"] == totals[-1]
    assert stats.total_at(99) == totals[-(-99 * len(totals) // 100) - 1]
    p = stats.total_tokens
    assert p["p50"] <= p["p90"] <= p["p99"] <= p["p99.5"] <= p["max"]


def test_vllm_and_guidellm_benchmark_results_are_read(tmp_path):
    vllm = tmp_path / "vllm.json"
    vllm.write_text(json.dumps({"duration": 10.0, "completed": 3, "input_lens": [10, 20, 30],
                                "output_lens": [1, 2, 3], "ttfts": [0.1, 0.2, 0.3]}))
    assert load_lengths(vllm) == [(10, 1), (20, 2), (30, 3)]
    guidellm = tmp_path / "guidellm.json"
    guidellm.write_text(json.dumps({"benchmarks": [{"requests": {"successful": [
        {"prompt_tokens": 7, "output_tokens": 4, "request_latency": 0.5},
        {"prompt_tokens": 9, "output_tokens": 5, "request_latency": 0.6}]}}]}))
    assert load_lengths(guidellm) == [(7, 4), (9, 5)]
