"""`tally quantize --scheme w8a8 --method smoothquant`: calibration max |x| per channel → smoothing folded into the
checkpoint, so per-token int8 activations survive outlier channels that plain W8A8 (rtn) does not."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from tally import LLM
from tally.errors import ConfigError
from tally.models.loader import load_checkpoint
from tally.models.prefill import prefill
from tally.quantize.cli import main
from tally.quantize.layer import QuantizeOptions
from tally.quantize.pipeline import QuantizeJob, fp_model, run
from tally.quantize.scheme import parse_scheme

OUTLIER = 60.0  # how much larger the outlier channels are than the rest


@pytest.fixture(scope="module")
def outlier_model(tiny_model_factory, tmp_path_factory):
    """The tiny llama with a few input channels of every q/k/v and gate/up made OUTLIER× larger (norm weight × c,
    the matching weight columns ÷ c): the same function, with the activation outliers real LLMs have."""
    src = tiny_model_factory("llama")
    out = tmp_path_factory.mktemp("outlier")
    for f in src.iterdir():
        shutil.copy2(f, out / f.name)
    tensors = load_file(str(src / "model.safetensors"))
    channels = torch.tensor([1, 5])
    for name in list(tensors):
        for norm, projections in (("input_layernorm", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
                                  ("post_attention_layernorm", ("mlp.gate_proj", "mlp.up_proj"))):
            if name.endswith(f"{norm}.weight"):
                prefix = name[: -len(f"{norm}.weight")]
                tensors[name][channels] *= OUTLIER
                for proj in projections:
                    tensors[f"{prefix}{proj}.weight"][:, channels] /= OUTLIER
    save_file(tensors, str(out / "model.safetensors"))
    return out


def logits_error(model_dir, quantized_dir) -> float:
    ref = LLM(str(model_dir), dtype="float32", kv_cache_memory=2_000_000)
    q = LLM(str(quantized_dir), dtype="float32", kv_cache_memory=2_000_000)
    ids = ref.get_tokenizer().encode("The quick brown fox jumps over the lazy dog. Paris is the capital of France.")
    want = ref.engine.model.compute_logits(prefill(ref.engine.model, ids))
    got = q.engine.model.compute_logits(prefill(q.engine.model, ids))
    return ((got - want).norm() / want.norm()).item()


def test_smoothquant_beats_plain_w8a8_on_activation_outliers(outlier_model, calib_file, tmp_path):
    w8a8 = parse_scheme("w8a8")
    plain = run(QuantizeJob(str(outlier_model), tmp_path / "rtn", QuantizeOptions(w8a8, "rtn"))).out
    smooth = run(QuantizeJob(str(outlier_model), tmp_path / "sq", QuantizeOptions(w8a8, "smoothquant", alpha=0.5),
                             calib=calib_file)).out
    layer = LLM(str(smooth), dtype="float32", kv_cache_memory=2_000_000).engine.model.layers[0].qkv_proj
    assert layer.scheme == "w8a8"
    meta = json.loads((smooth / "config.json").read_text())["quantization_config"]
    assert meta["method"] == "smoothquant" and meta["smoothquant_alpha"] == 0.5
    plain_err, smooth_err = logits_error(outlier_model, plain), logits_error(outlier_model, smooth)
    assert smooth_err < 0.5 * plain_err, (smooth_err, plain_err)
    assert smooth_err < 0.05


def effective_error(model_dir, calib_file, out, options: QuantizeOptions) -> float:
    """Relative logits error of the quantized layers' dense equivalents (activations in fp32)."""
    result = run(QuantizeJob(str(model_dir), out, options, calib=calib_file))
    ckpt = load_checkpoint(str(model_dir))
    weights = {n: t.float() for n, t in ckpt.tensors()}
    folded = dict(weights)
    for layer in result.layers:
        folded |= layer.effective
    ids = list(range(3, 40))
    want, got = fp_model(ckpt.config, weights, 64), fp_model(ckpt.config, folded, 64)
    ref = want.compute_logits(prefill(want, ids))
    return ((got.compute_logits(prefill(got, ids)) - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_smoothquant_folds_preserve_the_function(outlier_model, calib_file, tmp_path, alpha):
    """With activations in fp32 the folded weights and norms compute what the original model computes, up to the
    int8 weights' rounding (the same size as plain rounding's): a wrong fold (v rows, up rows, either norm) would
    be off by far more."""
    w8a8 = parse_scheme("w8a8")
    rounding = effective_error(outlier_model, calib_file, tmp_path / "rtn", QuantizeOptions(w8a8, "rtn"))
    smoothed = effective_error(outlier_model, calib_file, tmp_path / "sq",
                               QuantizeOptions(w8a8, "smoothquant", alpha=alpha))
    assert smoothed < 3 * rounding + 1e-3, (smoothed, rounding)


def test_smoothquant_needs_w8a8_and_an_alpha_in_range(tiny_llama, calib_file, tmp_path, capsys):
    with pytest.raises(ConfigError, match="use --scheme w8a8"):
        QuantizeOptions(parse_scheme("w4a16-g32"), "smoothquant")
    assert main(["--model", str(tiny_llama), "--scheme", "w8a8", "--method", "smoothquant", "--alpha", "1.5",
                 "--calib", str(calib_file), "--out", str(tmp_path / "x")]) == 2
    assert "--alpha 1.5 must be between 0 and 1" in capsys.readouterr().err
