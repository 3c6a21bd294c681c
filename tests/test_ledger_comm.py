"""The plan's communication time for a split model: the engine's collectives, each a link latency plus its bytes."""
from __future__ import annotations

import json

import pytest

from tally.cli import main
from tally.ledger.comm import LINKS, Link, step_comm
from tally.ledger.link_probe import measure_gloo_link
from tally.ledger.model_source import resolve_model

SMOLLM2 = resolve_model("SmolLM2-135M").config  # 30 layers, hidden 576, vocabulary 49,152
SLOW = Link("slow", latency_s=1e-3, bandwidth_bytes_per_s=1e9)


def test_tensor_parallel_makes_four_collectives_a_layer_plus_embedding_and_head():
    c = step_comm(SMOLLM2, tp=2, pp=1, tokens=1, logit_rows=1, activation_bytes=4, link=SLOW)
    assert c.collectives == 122
    # the embedding's all-reduce of one hidden state (a ring moves it once through each of 2 ranks), then half of
    # each all-gathered row: attention output (576), o_proj's (576), MLP columns (1,536), down_proj's (576), logits
    assert c.bytes_per_rank == 576 * 4 + (30 * (576 + 576 + 1536 + 576) * 4 + 49_152 * 4) / 2
    assert c.seconds == pytest.approx(122e-3 + c.bytes_per_rank / 1e9)
    partial = step_comm(SMOLLM2, tp=2, pp=1, tokens=1, logit_rows=1, activation_bytes=4, link=SLOW, partial_sums=True)
    assert partial.collectives == 62  # batch_invariant off: two all-reduces a layer
    assert partial.bytes_per_rank == 61 * 576 * 4 + 49_152 * 4 / 2


def test_pipeline_parallel_sends_each_micro_batch_across_each_boundary_and_logits_home():
    one = step_comm(SMOLLM2, tp=1, pp=2, tokens=1, logit_rows=1, activation_bytes=4, link=SLOW)
    assert one.collectives == 2  # a hidden state to stage 1, the logits back to rank 0
    many = step_comm(SMOLLM2, tp=1, pp=4, tokens=8, logit_rows=8, activation_bytes=2, link=SLOW)
    assert many.collectives == 4 * 3 + 4  # 4 micro-batches through 3 boundaries, 4 logit sends


def test_one_device_talks_to_nobody():
    assert step_comm(SMOLLM2, tp=1, pp=1, tokens=32, logit_rows=32, activation_bytes=2, link=SLOW).seconds == 0


def _plan(capsys, *args: str) -> dict:
    assert main(["plan", "--model", "SmolLM2-135M", "--device", "h100-80gb", "--max-model-len", "2048", *args,
                 "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_split_plan_adds_communication_to_the_decode_step(capsys):
    one = _plan(capsys)["decode_one"]
    split = _plan(capsys, "-tp", "2", "--link", "pcie4")
    d = split["decode_one"]
    assert split["comm_one"]["collectives"] == 122 and split["comm_one"]["link"] == "pcie4"
    assert d["comm_s"] == split["comm_one"]["seconds"] >= 122 * LINKS["pcie4"].latency_s
    assert d["step_s"] == pytest.approx(max(d["memory_s"], d["compute_s"]) + d["comm_s"])
    assert d["bound"] == "communication" and one["comm_s"] == 0  # 3 ms of latency against ~0.1 ms of reading
    assert split["split"]["nccl_bytes"] > 0  # GPUs talk through NCCL, which keeps buffers of its own


def test_an_unknown_link_is_refused_with_the_names_that_work(capsys):
    assert main(["plan", "--model", "SmolLM2-135M", "--device", "l4", "-tp", "2", "--link", "carrier-pigeon"]) == 2
    err = capsys.readouterr().err
    assert "carrier-pigeon" in err and "nvlink4" in err and "gloo" in err


def test_the_gloo_link_is_measured_between_two_processes():
    link = measure_gloo_link(calls=50)
    assert link.measured and link.backend == "gloo"
    assert 0 < link.latency_s < 1 and link.bandwidth_bytes_per_s > 0
