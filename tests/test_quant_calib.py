"""Calibrated quantization: GPTQ and AWQ against RTN on the errors they exist to reduce, the calibration set's
warnings, mixed precision, and errors that say what to use."""
from __future__ import annotations

import json

import pytest
import torch

from tally.errors import ConfigError
from tally.layers.dense import DenseLinear, Fp32PanelLinear
from tally.quantize.awq import search_scales
from tally.quantize.calibrate import load_calibration
from tally.quantize.cli import main
from tally.quantize.gptq import gptq_quantize
from tally.quantize.scheme import parse_scheme, rtn_dequantized


def rel_output_error(x: torch.Tensor, w: torch.Tensor, w_q: torch.Tensor) -> float:
    return float(((x @ (w - w_q).T) ** 2).sum() / ((x @ w.T) ** 2).sum())


def correlated_activations(gen: torch.Generator, rows: int, k: int, mix: torch.Tensor) -> torch.Tensor:
    """Activations living near a low-rank subspace, as transformer activations do (the case GPTQ exploits)."""
    return torch.randn(rows, mix.shape[0], generator=gen) @ mix + 0.3 * torch.randn(rows, k, generator=gen)


@pytest.mark.parametrize("scheme", ["w4a16-g32", "w4a16-g128", "w8a16"])
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_beats_rtn_on_layer_output_error_for_calibration_like_data(scheme, act_order):
    gen = torch.Generator().manual_seed(0)
    w = 0.05 * torch.randn(96, 256, generator=gen)
    mix = torch.randn(24, 256, generator=gen)
    calib, held_out = (correlated_activations(gen, 1024, 256, mix) for _ in range(2))
    q, grid = gptq_quantize(w, 2 * calib.T @ calib / len(calib), parse_scheme(scheme), act_order=act_order)
    gptq_err = rel_output_error(held_out, w, grid.dequantize(q))
    rtn_err = rel_output_error(held_out, w, rtn_dequantized(w, parse_scheme(scheme)))
    assert gptq_err < 0.5 * rtn_err


def test_awq_beats_rtn_on_activations_with_outlier_channels():
    gen = torch.Generator().manual_seed(1)
    w = 0.05 * torch.randn(128, 256, generator=gen)
    boost = torch.ones(256)
    boost[torch.randperm(256, generator=gen)[:8]] = 30.0  # a few channels carry most of the activation energy
    calib, held_out = (torch.randn(512, 256, generator=gen) * boost for _ in range(2))
    scheme = parse_scheme("w4a16-g128")
    s, alpha = search_scales(calib, calib.abs().mean(0), [w], scheme)
    awq_err = rel_output_error(held_out, w, rtn_dequantized(w * s, scheme) / s)
    rtn_err = rel_output_error(held_out, w, rtn_dequantized(w, scheme))
    assert alpha > 0 and awq_err < 0.7 * rtn_err


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture()
def calib_file(tmp_path):
    prompts = [{"prompt": f"The quick brown fox {i} jumps over the lazy dog in Paris."} for i in range(10)]
    return write_jsonl(tmp_path / "calib.jsonl", prompts)


def tokenizer_of(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)


def test_calibration_warns_below_128_samples_and_without_a_system_prompt(tiny_llama, calib_file):
    calib = load_calibration(calib_file, tokenizer_of(tiny_llama))
    assert len(calib.token_ids) == 10
    assert any("10 samples" in w and "128" in w for w in calib.warnings)
    assert any("--deployment-system-prompt" in w for w in calib.warnings)


def test_calibration_renders_the_system_prompt_through_the_chat_template(tiny_llama, tmp_path):
    tok = tokenizer_of(tiny_llama)
    records = [{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}] * 130
    calib = load_calibration(write_jsonl(tmp_path / "c.jsonl", records), tok)
    assert calib.warnings == []
    assert "<|im_start|>system\nBe brief.<|im_end|>" in tok.decode(calib.token_ids[0])
    deployed = load_calibration(write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Hi"}]), tok,
                                deployment_system_prompt="You are Tally.")
    assert tok.decode(deployed.token_ids[0]).startswith("<|im_start|>system\nYou are Tally.<|im_end|>")
    assert not any("system prompt" in w for w in deployed.warnings)


def test_keep_high_precision_keeps_those_layers_dense(tiny_llama, calib_file, tmp_path):
    from tally import LLM

    out = tmp_path / "q"
    assert main(["--model", str(tiny_llama), "--scheme", "w4a16-g32", "--method", "gptq", "--calib", str(calib_file),
                 "--keep-high-precision", "first,lm_head", "--out", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["quantization_config"]["dense_layers"] == [0]
    layers = LLM(str(out), dtype="float32", kv_cache_memory=2_000_000).engine.model.layers
    dense = (DenseLinear, Fp32PanelLinear)  # fp32 panels: batch_invariant's fp32 path
    assert all(isinstance(getattr(layers[0], s), dense) for s in ("qkv_proj", "o_proj", "down_proj"))
    assert all(getattr(layers[1], s).scheme == "int4" for s in ("qkv_proj", "o_proj", "down_proj"))


def test_auto_mixed_keeps_the_most_sensitive_layer_dense(tiny_llama, calib_file, tmp_path, capsys):
    out = tmp_path / "q"
    assert main(["--model", str(tiny_llama), "--scheme", "w4a16-g32", "--method", "awq", "--calib", str(calib_file),
                 "--auto-mixed", "1", "--out", str(out)]) == 0
    report = capsys.readouterr().out
    ranked = [line for line in report.splitlines() if line.startswith("  layer")]
    assert len(ranked) == 2 and ranked[0].endswith("kept dense") and not ranked[1].endswith("kept dense")
    kept = int(ranked[0].split()[1])
    assert json.loads((out / "config.json").read_text())["quantization_config"]["dense_layers"] == [kept]


@pytest.mark.parametrize("flag, value, hint", [
    ("--scheme", "w3a16", "w4a16-g128 (or -g64, -g32), w8a16, w8a8"),
    ("--scheme", "w4a16-g100", "w4a16-g128 (or -g64, -g32), w8a16, w8a8"),
    ("--method", "hqq", "use gptq, awq, rtn or smoothquant"),
    ("--keep-high-precision", "middle", "use first, last, lm_head or a layer index"),
])
def test_unknown_scheme_method_or_layer_errors_say_what_to_use(tiny_llama, calib_file, tmp_path, capsys,
                                                              flag, value, hint):
    args = {"--model": str(tiny_llama), "--scheme": "w8a16", "--method": "rtn", "--calib": str(calib_file),
            "--out": str(tmp_path / "q"), flag: value}
    assert main([a for kv in args.items() for a in kv]) == 2
    assert hint in capsys.readouterr().err


def test_calibrated_methods_without_a_calibration_set_say_how_to_fix_it(tiny_llama, tmp_path, capsys):
    assert main(["--model", str(tiny_llama), "--scheme", "w8a16", "--method", "gptq", "--out", str(tmp_path)]) == 2
    assert "need --calib" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="scheme"):
        parse_scheme("int4")
