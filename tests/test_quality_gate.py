"""`tally eval` end to end on tiny checkpoints: an unchanged model passes with zero deltas, a model with a
zeroed layer fails with exit code 1, and the JSON report holds the decoding settings."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from tally.quality.cli import EXIT_NO_GO, EXIT_USAGE, main

SMALL = ["--max-model-len", "256", "--ppl-tokens", "128", "--max-tokens", "6", "--limit", "2", "--threads", "1"]


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()  # --threads sets a process-wide torch setting
    yield
    torch.set_num_threads(threads)


def _zeroed_copy(src, dst, layer: int):
    shutil.copytree(src, dst)
    path = dst / "model.safetensors"
    tensors = load_file(path)
    prefix = f"model.layers.{layer}."
    zeroed = {k: torch.zeros_like(v) if k.startswith(prefix) else v for k, v in tensors.items()}
    assert any(k.startswith(prefix) for k in tensors)
    save_file(zeroed, path, metadata={"format": "pt"})
    return dst


def test_unchanged_model_passes_with_zero_deltas_and_json_holds_the_decoding(tiny_llama, tmp_path):
    out = tmp_path / "report.json"
    rc = main(["--baseline", str(tiny_llama), "--candidate", str(tiny_llama), *SMALL, "--out", str(out)])
    report = json.loads(out.read_text())
    assert rc == 0
    assert report["overall"] == "pass" and report["go"] is True
    suites = {s["name"]: s for s in report["suites"]}
    assert set(suites) == {"ppl", "tasks/json", "tasks/numbers", "tasks/format", "longtail"}
    assert suites["ppl"]["loss"] == 0.0 and suites["ppl"]["details"]["tokens"] > 0
    assert suites["longtail"]["candidate"] == 1.0
    assert report["worst_longtail"] == []
    assert report["settings"]["decoding"] == {"temperature": 0.0, "max_tokens": 6, "batch_size": 32,
                                              "max_num_batched_tokens": 1024}
    assert report["max_model_len"] == 256


def test_model_with_a_zeroed_layer_fails_the_gate(tiny_llama, tmp_path, capsys):
    broken = _zeroed_copy(tiny_llama, tmp_path / "broken", layer=0)
    out = tmp_path / "report.json"
    rc = main(["--baseline", str(tiny_llama), "--candidate", str(broken), *SMALL, "--out", str(out)])
    report = json.loads(out.read_text())
    assert rc == EXIT_NO_GO
    assert report["overall"] == "fail" and report["go"] is False
    longtail = next(s for s in report["suites"] if s["name"] == "longtail")
    assert longtail["verdict"] == "fail"
    assert report["worst_longtail"], "the report names the cases that diverged"
    assert "NO-GO" in capsys.readouterr().out


def test_corrupt_option_zeroes_a_layer_of_the_loaded_candidate(tiny_llama):
    rc = main(["--baseline", str(tiny_llama), "--candidate", str(tiny_llama), "--candidate-corrupt", "zero-layer:1",
               "--suites", "longtail", *SMALL])
    assert rc == EXIT_NO_GO


@pytest.mark.parametrize("bad", [["--thresholds", "ppl=5"], ["--thresholds", "speed=1,2"], ["--suites", "vibes"],
                                 ["--thresholds", "ppl=5,2"]])
def test_bad_settings_exit_with_usage_code_before_loading_a_model(bad, capsys):
    assert main(["--baseline", "/nonexistent", *bad]) == EXIT_USAGE
    assert "tally eval:" in capsys.readouterr().err


def test_int8_kv_candidate_changes_only_the_kv_cache(tiny_llama, tmp_path):
    out = tmp_path / "report.json"
    main(["--baseline", str(tiny_llama), "--candidate", str(tiny_llama), "--candidate-kv-cache-dtype", "int8",
          *SMALL, "--suites", "ppl", "--out", str(out)])
    report = json.loads(out.read_text())
    assert "kv int8" in report["candidate"]["label"] and report["candidate"]["kv_cache_dtype"] == "int8"
    ppl = report["suites"][0]
    assert ppl["loss"] != 0.0 and abs(ppl["loss"]) < 5.0  # int8 KV moves perplexity, but only a little
