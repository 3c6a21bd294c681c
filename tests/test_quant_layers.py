"""Each quantized layer against its own dequantized weights in fp32, on both kernel paths."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tally.errors import ConfigError
from tally.layers.linear import build_linear
from tally.quant import base
from tally.quant.dispatch import NEVER
from tally.quant.int4 import Int4Linear
from tally.quant.int8 import Int8Linear
from tally.quant.rtn import (
    dequantize_int4,
    dequantize_int8,
    quantize_int4_groupwise,
    quantize_int8_per_channel,
)

FEW, MANY = "few", "many"


@pytest.fixture(autouse=True)
def small_tiles(monkeypatch):
    """Tiles of a few rows, so the many-token path's tiling (and its last, partial tile) is exercised."""
    monkeypatch.setattr(base, "TILE_BYTES", 64 << 10)


def force(layer, path: str):
    layer.many_tokens_from = NEVER if path == FEW else 1
    return layer


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.float() - ref).norm() / ref.norm()).item()


def weights(out_features: int, in_features: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(out_features, in_features, generator=gen) * 0.05, torch.randn(out_features, generator=gen)


def acts(*shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("path", [FEW, MANY])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
def test_int8_layer_matches_dequantized_reference(path, dtype, tol):
    w, b = weights(96, 128)
    q, scale = quantize_int8_per_channel(w, scale_dtype=dtype)
    layer = force(Int8Linear(q, scale, b, dtype), path)
    x = acts(2, 5, 128)
    ref = F.linear(x, dequantize_int8(q, scale), b)
    y = layer(x.to(dtype))
    assert y.shape == (2, 5, 96) and y.dtype == dtype
    assert rel_err(y, ref) < tol


@pytest.mark.parametrize("path", [FEW, MANY])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 5e-3)])
def test_int4_layer_matches_its_dequantized_weights(path, group_size, dtype, tol):
    w, b = weights(72, 256)  # 72 rows: not a multiple of the kernel's row block, so padding is exercised
    q, scale, zero = quantize_int4_groupwise(w, group_size, scale_dtype=dtype)
    layer = force(Int4Linear(q, scale, zero, group_size, b, dtype), path)
    x = acts(3, 4, 256)
    ref = F.linear(x, dequantize_int4(q, scale, zero, group_size), b)
    y = layer(x.to(dtype))
    assert y.shape == (3, 4, 72) and y.dtype == dtype
    assert rel_err(y, ref) < tol


def test_int8_layer_whose_in_features_the_kernel_cannot_read_uses_the_dense_path():
    # `_weight_int8pack_mm` kills the process when K % 4 != 0; such layers must never reach it.
    w, b = weights(8, 70)
    layer = build_linear(w, b, quantization="int8", dtype=torch.bfloat16)
    assert layer.many_tokens_from == 1
    x = acts(1, 70)
    assert rel_err(layer(x.bfloat16()), F.linear(x, w, b)) < 2e-2


def test_rtn_quantizers_stay_within_half_a_step():
    w, _ = weights(64, 128)
    q8, s8 = quantize_int8_per_channel(w)
    assert ((dequantize_int8(q8, s8) - w).abs() <= s8[:, None] / 2 + 1e-7).all()
    q4, s4, z4 = quantize_int4_groupwise(w, 32)
    assert q4.dtype == torch.uint8 and int(q4.max()) <= 15
    step = s4.repeat_interleave(32, dim=1)
    assert ((dequantize_int4(q4, s4, z4, 32) - w).abs() <= step / 2 + 1e-6).all()


@pytest.mark.parametrize("matmul_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("scheme,tol", [("int8", 1e-2), ("int4", 5e-3), ("w8a8", 2e-2)])
def test_batch_size_dispatch_gives_the_same_rows_on_both_paths(scheme, tol, matmul_dtype):
    # The many-token path multiplies in bf16 or fp32 depending on the CPU; both variants are checked here.
    w, b = weights(128, 256)
    layer = build_linear(w, b, quantization=scheme, dtype=torch.bfloat16, group_size=64)
    layer.matmul_dtype = matmul_dtype
    x = acts(64, 256).bfloat16()
    many = force(layer, MANY)(x)
    few = force(layer, FEW)(x)
    assert rel_err(many, few.float()) < tol


@pytest.mark.parametrize("scheme", ["int8", "int4", "w8a8"])
def test_dispatch_takes_the_many_token_path_from_its_threshold(scheme):
    w, b = weights(64, 128)
    layer = build_linear(w, b, quantization=scheme, dtype=torch.bfloat16, group_size=32)
    below, at = acts(3, 128).bfloat16(), acts(4, 128).bfloat16()
    layer.many_tokens_from = 4
    dispatched = layer(below), layer(at)
    assert torch.equal(dispatched[0], force(layer, FEW)(below))
    assert torch.equal(dispatched[1], force(layer, MANY)(at))


def test_none_scheme_is_dense_in_the_compute_dtype():
    w, b = weights(16, 32)
    layer = build_linear(w, b, quantization="none", dtype=torch.bfloat16)
    x = acts(3, 32).bfloat16()
    torch.testing.assert_close(layer(x), F.linear(x, w.bfloat16(), b.bfloat16()))


def test_unknown_scheme_names_the_choices():
    with pytest.raises(ConfigError, match="int8, int4, w8a8"):
        build_linear(torch.zeros(8, 32), None, quantization="int3", dtype=torch.float32)


@pytest.mark.parametrize("group_size,in_features,hint", [(96, 256, "32, 64 or 128"), (128, 96, "group size 32")])
def test_bad_int4_group_size_says_what_to_choose(group_size, in_features, hint):
    with pytest.raises(ConfigError, match=hint):
        build_linear(torch.zeros(16, in_features), None, quantization="int4", dtype=torch.float32,
                    group_size=group_size)


def test_layers_report_the_bytes_they_keep():
    w, _ = weights(128, 256)
    int8 = build_linear(w, None, quantization="int8", dtype=torch.bfloat16)
    int4 = build_linear(w, None, quantization="int4", dtype=torch.bfloat16, group_size=128)
    assert int8.weight_nbytes() == 128 * 256 + 128 * 2
    assert int4.weight_nbytes() == 128 * 256 // 2 + (256 // 128) * 128 * 2 * 2
