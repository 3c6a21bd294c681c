"""GGUF's IQ4_NL, IQ4_XS and MXFP4 held as stored, 4-bit indices into a table of 16 int8 values (int_dots.h: LUT4),
against the int8 layer of the values they stand for: the same integer sums and float operations, so the same bits,
at row counts that take each of the kernels' loops, on every build this CPU runs (AVX2, VNNI, AVX-512)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from test_gguf_block_types import random_blocks
from test_quant_gguf import raw_tensor

from tally.layers.linear import linear_from_blocks, linear_from_gguf
from tally.native import library, ops
from tally.quant.gguf_blocks import TableBlocks, concat_blocks, read_blocks
from tally.quant.native_linear import NativeInt8Linear, NativeTableLinear

pytestmark = pytest.mark.skipif(not ops.available(), reason="native kernels unavailable (see tally/native/library.py)")

ROWS = (1, 3, 5, 8, 9, 64, 70)  # one row, the micro-tiles (4; AVX-512: 8 and pairs from 5), past a 64-row pass


def mxfp4_blocks(n: int, k: int, seed: int) -> np.ndarray:
    """Random MXFP4 blocks: any nibbles, exponents around 2^0 (scales 2^(e - 128))."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (n, k // 32, 17), dtype=np.uint8)
    blocks[..., 0] = rng.integers(118, 130, (n, k // 32), dtype=np.uint8)
    return blocks.reshape(n, -1)


def table_raw(ggml_type: Q, n: int, k: int, seed: int):
    data = mxfp4_blocks(n, k, seed) if ggml_type == Q.MXFP4 else random_blocks(ggml_type, n, k, seed)
    return raw_tensor(ggml_type, (n, k), data)


@pytest.mark.parametrize("ggml_type", [Q.IQ4_NL, Q.IQ4_XS, Q.MXFP4], ids=lambda t: t.name)
def test_table_layer_is_the_int8_layer_bit_for_bit(ggml_type):
    n, k = 44, 512  # 44: an odd number of tiles, the last partial (AVX-512 pairs tiles)
    raw = table_raw(ggml_type, n, k, seed=int(ggml_type))
    blocks = read_blocks(raw)
    assert isinstance(blocks, TableBlocks) and blocks.q.dtype == torch.uint8
    layer = linear_from_gguf(raw, None, compute_dtype=torch.float32)
    assert isinstance(layer, NativeTableLinear) and layer.bits == ops.LUT4
    as_int8 = blocks.as_int8()
    int8 = NativeInt8Linear(as_int8.q, as_int8.scale, None)
    assert layer.d.dtype == int8.s.dtype  # the scales in the same form: the same floats
    assert layer.qs.nbytes * 2 == int8.q.nbytes  # half the weight bytes
    for rows in ROWS:
        x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
        assert torch.equal(layer(x), int8(x)), rows
    ids = torch.tensor([0, 43, 7, 8])
    assert torch.equal(layer.embedding_rows(ids), int8.embedding_rows(ids))
    assert torch.equal(layer._weight_t(0, 48), int8._weight_t(0, 48))  # the many-token path's bf16 weights


def test_every_build_gives_the_int8_kernels_bits():
    """Per build (each ISA this CPU runs), gemm_q4 over the table's indices against the same build's gemm_q8 over
    the values, with bias and accumulation."""
    gen = torch.Generator().manual_seed(5)
    n, k = 68, 256
    table = torch.randint(-128, 128, (16,), dtype=torch.int8, generator=gen)  # -128 too: the sign trick's edge
    q = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=gen)
    qs, q8 = ops.pack_q4(q), ops.pack_q8(table[q.long()])
    bias = torch.randn(n, generator=gen)
    for half in (False, True):
        d = ops.pack_tile_scales(torch.randint(1, 64, (n, k // 32), generator=gen) / 1024.0, half)
        for name, flags in library.builds().items():
            lib = library.load_build(flags)
            for rows in ROWS:
                x = torch.randn(rows, k, generator=gen)
                start = torch.randn(rows, n, generator=gen)
                want, got = start.clone(), start.clone()
                lib.tally_gemm_q8(x.data_ptr(), q8.data_ptr(), d.data_ptr(), bias.data_ptr(), want.data_ptr(), rows,
                                  n, k, 32, 1, 0, ops.scale_form(d), 0)
                lib.tally_gemm_q4(x.data_ptr(), qs.data_ptr(), table.data_ptr(), d.data_ptr(), None, bias.data_ptr(),
                                  got.data_ptr(), rows, n, k, 32, ops.LUT4, 1, ops.scale_form(d))
                assert torch.equal(want, got), (name, rows, half)


def test_fused_parts_keep_one_table_or_fall_back_to_int8_values():
    """Parts of one table stack as indices; parts of different tables, or beside Q8_0, as int8 values."""
    nl, mx = (read_blocks(table_raw(t, 16, 64, seed=1)) for t in (Q.IQ4_NL, Q.MXFP4))
    same = concat_blocks([nl, nl])
    assert isinstance(same, TableBlocks) and torch.equal(same.q, torch.cat([nl.q, nl.q]))
    mixed = concat_blocks([nl, mx])
    assert torch.equal(mixed.q, torch.cat([nl.as_int8().q, mx.as_int8().q]))
    assert torch.equal(mixed.scale, torch.cat([nl.scale, mx.scale]))


def test_off_the_native_kernels_the_values_go_to_pytorchs_int8_layer():
    blocks = read_blocks(table_raw(Q.MXFP4, 16, 64, seed=2))
    layer = linear_from_blocks(blocks, None, compute_dtype=torch.bfloat16)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
    w = blocks.as_int8().q.float() * blocks.scale.repeat_interleave(32, dim=1)
    ref = x @ w.T
    assert ((layer(x.bfloat16()).float() - ref).abs().max() / ref.abs().max()).item() < 0.02


def test_experts_call_on_table_layers_is_the_int8_experts_bit_for_bit():
    """GPT-OSS's MXFP4 experts in the one-call experts region (tally/native/experts.h): the table layers against
    int8 layers of the same values, routing and clamped SwiGLU as GPT-OSS's."""
    from types import SimpleNamespace

    from torch import nn

    from tally.models.native_experts import NativeExperts

    gen = torch.Generator().manual_seed(9)
    num_experts, hidden, inner = 4, 128, 64
    parts = [[read_blocks(table_raw(Q.MXFP4, out, inp, seed=10 * e + i))
              for i, (out, inp) in enumerate(((2 * inner, hidden), (hidden, inner)))] for e in range(num_experts)]

    def experts(layer) -> NativeExperts:
        moe = SimpleNamespace(top_k=2, normalize=True, routing="top_k_softmax", activation_name="clamped_swiglu",
                              swiglu=(1.702, 7.0), router=torch.randn(num_experts, hidden, generator=gen),
                              router_bias=None, gate_up=nn.ModuleList([layer(p[0]) for p in parts]),
                              down=nn.ModuleList([layer(p[1]) for p in parts]))
        built = NativeExperts.build(moe)
        assert built is not None
        built.moe = moe  # the layers the struct points into, alive as long as it is
        return built

    table = experts(lambda b: linear_from_blocks(b, None, compute_dtype=torch.float32))
    gen.manual_seed(9)  # the same router
    int8 = experts(lambda b: NativeInt8Linear(b.as_int8().q, b.as_int8().scale, None))
    assert all(isinstance(m, NativeTableLinear) for m in table.moe.gate_up)
    for rows in (1, 3, 8, 64):
        x = torch.randn(rows, hidden, generator=torch.Generator().manual_seed(rows))
        assert torch.equal(table(x), int8(x)), rows


def test_path_timing_times_table_layers_at_their_bytes():
    """The start-up measurement (tally/layers/path_timing.py) times a GGUF's IQ4 / MXFP4 projections as served."""
    from tally.layers.path_timing import ComputePath, ProjectionShape, timing_layers

    shape = ProjectionShape("gate_up", 64, 128, 1, "lut4", 32)
    layers = timing_layers(shape, ComputePath(torch.float32, torch.float32), 2, torch.Generator().manual_seed(0))
    assert all(isinstance(layer, NativeTableLinear) for layer in layers)
    assert shape.weight_bytes(torch.float32) == 64 * 128 * 0.5
