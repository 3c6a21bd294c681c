"""W8A8 (per-token int8 activations x per-channel int8 weights) and SmoothQuant on outlier activations."""
from __future__ import annotations

import pytest
import torch

from tally.layers.linear import w8a8_from_float
from tally.native import ops
from tally.quant import base
from tally.quant.dispatch import NEVER
from tally.quant.native_linear import NativeW8A8Linear
from tally.quant.rtn import quantize_int8_per_channel
from tally.quant.w8a8 import W8A8Linear, quantize_per_token
from tally.quantize.smooth import fold_smoothing_into_norm, smooth_scales

K, N, M = 512, 256, 64


@pytest.fixture(autouse=True)
def small_tiles(monkeypatch):
    """Tiles of a few rows, so the many-token path's tiling (and its last, partial tile) is exercised."""
    monkeypatch.setattr(base, "TILE_BYTES", 64 << 10)


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.float() - ref).norm() / ref.norm()).item()


@pytest.fixture(scope="module")
def outlier_case() -> tuple[torch.Tensor, torch.Tensor]:
    """Weights ~N(0, 0.05); activations ~N(0, 1) except six channels 60x larger, as LLM hidden states have."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(N, K, generator=gen) * 0.05
    x = torch.randn(M, K, generator=gen)
    x[:, torch.randperm(K, generator=gen)[:6]] *= 60
    return w, x


def int_mm_layer(w: torch.Tensor, dtype: torch.dtype, *, smooth: torch.Tensor | None = None,
                 smoothing_folded: bool = False) -> W8A8Linear:
    """The PyTorch W8A8 layer, forced onto its integer-matmul path."""
    ws = w if smooth is None else w * smooth[None, :]
    q, scale = quantize_int8_per_channel(ws, scale_dtype=dtype)
    layer = W8A8Linear(q, scale, None, dtype, None if smoothing_folded else smooth)
    layer.many_tokens_from = 1
    return layer


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_smoothing_reduces_w8a8_error_on_outlier_channels(outlier_case, dtype):
    w, x = outlier_case
    ref = x @ w.T
    plain = rel_err(int_mm_layer(w, dtype)(x.to(dtype)), ref)
    smooth = smooth_scales(x.abs().amax(dim=0), w, alpha=0.5)
    smoothed = rel_err(int_mm_layer(w, dtype, smooth=smooth)(x.to(dtype)), ref)
    assert plain < 0.06  # measured 0.036: the outliers coarsen every other channel's int8 step
    assert smoothed < 0.015  # measured 0.009
    assert smoothed < plain / 2


def test_w8a8_on_ordinary_activations_is_within_two_percent():
    gen = torch.Generator().manual_seed(3)
    w, x = torch.randn(N, K, generator=gen) * 0.05, torch.randn(M, K, generator=gen)
    assert rel_err(int_mm_layer(w, torch.bfloat16)(x.bfloat16()), x @ w.T) < 0.02  # measured 0.011


def test_smoothing_folded_into_the_norm_matches_smoothing_in_the_layer(outlier_case):
    w, x = outlier_case
    smooth = smooth_scales(x.abs().amax(dim=0), [w[:128], w[128:]], alpha=0.5)  # two layers sharing one norm
    norm_weight = torch.rand(K) + 0.5
    hidden = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)  # RMSNorm before its weight
    folded = int_mm_layer(w, torch.float32, smooth=smooth, smoothing_folded=True)
    inline = int_mm_layer(w, torch.float32, smooth=smooth)
    torch.testing.assert_close(folded(hidden * fold_smoothing_into_norm(norm_weight, smooth)),
                               inline(hidden * norm_weight), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int_mm_and_its_fp32_stand_in_agree(outlier_case, dtype):
    """Where the CPU has no VNNI the layer multiplies the same int8 operands in fp32 instead of `_int_mm`."""
    w, x = outlier_case
    layer = int_mm_layer(w, dtype)
    outputs = []
    for use_int_mm in (True, False):
        layer.use_int_mm = use_int_mm
        outputs.append(layer(x[:8].to(dtype)).float())
    torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not ops.available(), reason="native kernels unavailable")
@pytest.mark.parametrize("smoothed", [False, True])
def test_native_w8a8_computes_the_same_integers(outlier_case, smoothed):
    """fp32 compute builds W8A8 on the native int8 kernel: per-token activation rounding, for every batch size."""
    w, x = outlier_case
    smooth = smooth_scales(x.abs().amax(dim=0), w, alpha=0.5) if smoothed else None
    native = w8a8_from_float(w, None, torch.float32, smooth=smooth)
    assert isinstance(native, NativeW8A8Linear)
    reference = int_mm_layer(w, torch.float32, smooth=smooth)
    diff = (native(x) - reference(x)).abs()
    # The same rounding rule, but an activation whose x / s lands within an ulp of a rounding boundary can round
    # the other way in C than in PyTorch (whose AVX-512 kernels contract and vectorise differently): one int8
    # step of that activation, times the row's largest weight, in a few outputs.
    xs = x if smooth is None else x / smooth
    ws = w if smooth is None else w * smooth[None, :]
    one_step = (xs.abs().amax(dim=1, keepdim=True) / 127) * ws.abs().amax(dim=1)[None, :]
    assert (diff <= 2 * one_step + 1e-3).all()
    assert (diff > 1e-3).float().mean() < 0.02
    assert torch.equal(native(x[:3]), native(x)[:3])  # a row's bits do not depend on its batch


def test_few_token_path_uses_the_same_smoothed_weight(outlier_case):
    w, x = outlier_case
    smooth = smooth_scales(x.abs().amax(dim=0), w, alpha=0.5)
    layer = int_mm_layer(w, torch.float32, smooth=smooth)
    layer.many_tokens_from = NEVER
    assert rel_err(layer(x[:2]), x[:2] @ w.T) < 0.01  # weight-only int8: no activation rounding at all


def test_per_token_quantization_leaves_its_input_alone():
    x = torch.randn(4, 64)
    before = x.clone()
    q, scale = quantize_per_token(x)
    assert torch.equal(x, before)
    assert q.dtype == torch.int8 and (q.float() * scale - x).abs().max() <= scale.max() / 2 + 1e-6
