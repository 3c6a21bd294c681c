"""Each native kernel against the PyTorch arithmetic it replaces (fp32; tolerances are summation order)."""
from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from support.int8_rounding import int8_blocks

from tally.native import ops

pytestmark = pytest.mark.skipif(not ops.available(), reason="native kernels unavailable (see tally/native/library.py)")

gen = torch.Generator().manual_seed(0)


def rand(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen)


def test_rows_read_back_from_integer_tiles() -> None:
    q8, s = torch.randint(-127, 128, (21, 64)), rand(21, 2)
    rows = torch.tensor([20, 0, 9])
    assert torch.equal(ops.q8_rows(ops.pack_q8(q8), rows), q8[rows].to(torch.int8))
    assert torch.equal(ops.tile_scale_rows(ops.pack_tile_scales(s), rows), s[rows])
    q4 = torch.randint(0, 16, (21, 64), dtype=torch.uint8)
    assert torch.equal(ops.q4_rows(ops.pack_q4(q4), rows), q4[rows])
    for bits in (5, 6):
        q = torch.randint(0, 1 << bits, (21, 64), dtype=torch.uint8)
        qs, qh = ops.pack_planes(q, bits)
        assert torch.equal(ops.q4_rows(qs, rows, qh), q[rows])


@pytest.mark.parametrize("form", ["fp32", "fp16", "factored"])
def test_dequantized_rows_give_the_pytorch_composition_of_the_read_back_values(form: str) -> None:
    """An embedding lookup from the tiles (dequant_q4_rows / dequant_q8_rows: one call) gives the floats the
    PyTorch composition of q4_rows / q8_rows and tile_scale_rows gives (q * d + m, two roundings), in every integer
    format and scale form, for rows anywhere, repeated, and in a partial last tile; a row outside the table raises."""
    n, k, rows = 21, 512, torch.tensor([20, 0, 9, 9, 16])

    def values(groups: int, sign: float = 1.0) -> torch.Tensor:  # a base per 256 weights times int8 steps
        base = torch.randint(1, 1 << 10, (n, k // 256), generator=gen) / 2.0 ** 14 * sign
        steps = torch.randint(-127, 128, (n, groups), generator=gen)
        if form == "factored":
            return ops.pack_tile_factors(base, steps)
        return ops.pack_tile_scales(base.repeat_interleave(groups // base.shape[1], 1) * steps.float(),
                                    half=form == "fp16")

    def composed(q: torch.Tensor, d: torch.Tensor, minima: torch.Tensor | float | None) -> torch.Tensor:
        """q * d (+ m: packed minima, or a multiple of d: int5 / int6's -2^(bits - 1) d) in PyTorch"""
        ds = ops.tile_scale_rows(d, rows).float()[:, :, None]
        w = q.view(len(rows), ds.shape[1], -1).float() * ds
        if isinstance(minima, torch.Tensor):
            w = w + ops.tile_scale_rows(minima, rows).float()[:, :, None]
        elif minima is not None:
            w = w + minima * ds
        return w.view(len(rows), k)

    q4 = ops.pack_q4(torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=gen))
    d16, m16 = values(16), values(16, -1.0)
    assert torch.equal(ops.dequant_q4_rows(q4, d16, m16, rows, 32), composed(ops.q4_rows(q4, rows), d16, m16))
    for bits, groups in ((5, 16), (6, 32)):  # GGUF's Q5_0 (groups of 32), Q6_K (16)
        qs, qh = ops.pack_planes(torch.randint(0, 1 << bits, (n, k), dtype=torch.uint8, generator=gen), bits)
        d = values(groups)
        assert torch.equal(ops.dequant_q4_rows(qs, d, None, rows, k // groups, qh=qh),
                           composed(ops.q4_rows(qs, rows, qh), d, -(2.0 ** (bits - 1))))
    q8, s = ops.pack_q8(torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)), values(16)
    assert torch.equal(ops.dequant_q8_rows(q8, s, rows, 32), composed(ops.q8_rows(q8, rows), s, None))
    for outside in (-1, 24):  # past the last tile's 8 rows (21 padded to 24), or negative: an error, no read
        with pytest.raises(IndexError, match="outside a table of 24 rows"):
            ops.dequant_q8_rows(q8, s, torch.tensor([3, outside]), 32)
        with pytest.raises(IndexError, match="outside a table of 24 rows"):
            ops.dequant_q4_rows(q4, d16, m16, torch.tensor([outside]), 32)


def test_scales_exact_in_fp16_are_held_in_fp16_with_the_same_results() -> None:
    """GGUF's own d and m are fp16 values: a layer keeps them in fp16 (half the bytes a decode streams for them) and
    gives the bits it gives with fp32 copies; one value off the fp16 grid keeps the whole layer in fp32."""
    from tally.quant.native_linear import NativeInt4Linear, NativeInt8Linear

    n, k = 20, 128
    q4, q8 = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=gen), torch.randint(-127, 128, (n, k))
    d, m = rand(n, k // 32).abs().half().float(), rand(n, k // 32).half().float()
    x = rand(5, k)
    layer = NativeInt4Linear(q4, d, m, 32, None)
    assert layer.d.dtype == layer.m.dtype == torch.float16
    qs, dt, mt = ops.pack_q4(q4), ops.pack_tile_scales(d), ops.pack_tile_scales(m)
    assert torch.equal(layer(x), ops.gemm_q4(x, qs, dt, mt, None, 32, n))
    rows = torch.tensor([3, 19])
    want = (q4[rows].float().view(2, -1, 32) * d[rows, :, None] + m[rows, :, None]).view(2, k)
    assert torch.equal(layer.embedding_rows(rows), want)
    off_grid = m.clone()
    off_grid[7, 2] += 1e-4
    assert NativeInt4Linear(q4, d, off_grid, 32, None).d.dtype == torch.float32
    int8 = NativeInt8Linear(q8.to(torch.int8), d, None)
    assert int8.s.dtype == torch.float16
    assert torch.equal(int8(x), ops.gemm_q8(x, ops.pack_q8(q8), ops.pack_tile_scales(d), None, 32, n))
    with pytest.raises(ValueError, match="share one form"):
        ops.gemm_q4(x, qs, ops.pack_tile_scales(d, half=True), mt, None, 32, n)


# m covers 1..4 rows and a remainder after whole blocks of 4; n a partial tile of 8 outputs
@pytest.mark.parametrize("m", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("group", [32, 64])
def test_gemm_q4_matches_dequantized_weights(m: int, group: int) -> None:
    n, k = 42, 128
    q = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=gen)
    # extreme activations and weights: a 32-block's eight byte products must not overflow their int16 sums
    q[0] = 15
    d, mins = rand(n, k // group).abs(), rand(n, k // group)
    scaled, offset = q.float() * d.repeat_interleave(group, 1), mins.repeat_interleave(group, 1)
    x, bias = rand(m, k), rand(n)
    x[0, :32] = 1.0
    qs, dt, mt = ops.pack_q4(q), ops.pack_tile_scales(d), ops.pack_tile_scales(mins)
    expected = int8_blocks(x) @ (scaled + offset).t()
    torch.testing.assert_close(ops.gemm_q4(x, qs, dt, mt, bias, group, n), expected + bias, atol=1e-4, rtol=1e-4)
    y = rand(m, n)
    torch.testing.assert_close(ops.gemm_q4(x, qs, dt, mt, None, group, n, out=y.clone()), y + expected,
                               atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("m", [1, 4, 7, 70])
def test_gemm_q4_without_minima_is_symmetric(m: int) -> None:
    """int4 with no minima (GGUF Q4_0): w = d * (q - 8), the offset taken off each block's integer dot."""
    n, k = 42, 128
    q = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=gen)
    q[0] = 15
    d = rand(n, k // 32).abs()
    x = rand(m, k)
    x[0, :32] = 1.0
    expected = int8_blocks(x) @ ((q.float() - 8) * d.repeat_interleave(32, 1)).t()
    torch.testing.assert_close(ops.gemm_q4(x, ops.pack_q4(q), ops.pack_tile_scales(d), None, None, 32, n), expected,
                               atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("m", [1, 4, 7])
@pytest.mark.parametrize("bits,group", [(5, 32), (6, 16), (6, 64)])
def test_gemm_with_high_bit_planes_matches_dequantized_weights(m: int, bits: int, group: int) -> None:
    """GGUF Q5_0's 5-bit values in groups of 32 and Q6_K's 6-bit values in groups of 16 (nibbles plus planes of
    high bits), w = d * (q - 2**(bits - 1))."""
    n, k = 42, 192
    q = torch.randint(0, 1 << bits, (n, k), dtype=torch.uint8, generator=gen)
    q[0] = (1 << bits) - 1  # the largest byte products: each chunk's int16 pairs must widen before they add up
    d = rand(n, k // group).abs()
    w = (q.float() - (1 << (bits - 1))) * d.repeat_interleave(group, 1)
    x, bias = rand(m, k), rand(n)
    x[0, :32] = 1.0
    (qs, qh), dt = ops.pack_planes(q, bits), ops.pack_tile_scales(d)
    expected = (int8_blocks(x).double() @ w.double().t()).float()  # fp32's own sum would round by ~2e-4 here
    torch.testing.assert_close(ops.gemm_q4(x, qs, dt, None, bias, group, n, qh=qh), expected + bias,
                               atol=1e-4, rtol=1e-4)
    y = rand(m, n)
    torch.testing.assert_close(ops.gemm_q4(x, qs, dt, None, None, group, n, out=y.clone(), qh=qh), y + expected,
                               atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("m", [1, 5])
@pytest.mark.parametrize("group", [32, 96])
def test_gemm_q8_matches_dequantized_weights(m: int, group: int) -> None:
    n, k = 27, 96 * 2
    q = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
    q[0], q[1] = 127, -127
    s = rand(n, k // group).abs() / 100
    w = q.float() * s.repeat_interleave(group, 1)
    x = rand(m, k)
    x[0, :32] = -1.0
    got = ops.gemm_q8(x, ops.pack_q8(q), ops.pack_tile_scales(s), None, group, n)
    torch.testing.assert_close(got, int8_blocks(x) @ w.t(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("group", [32, 640])
@pytest.mark.parametrize("per_token", [False, True])
def test_gemm_q8_one_row_of_symmetric_weights_gives_the_general_loops_bits(group: int, per_token: bool) -> None:
    """The one-row loop for weights within +-127 (int_dots.h: int8_one_row_dots) forms the same integer sums as the
    general loop, and a row's output is the same alone or among others; a -128 keeps a layer off it."""
    n, k = 45, 640
    q = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
    q[0], q[1, :32] = 127, -127
    qp, s = ops.pack_q8(q), ops.pack_tile_scales(rand(n, k // group).abs() / 100)
    x = rand(4, k) * 3
    x[0, :32] = -1.0
    alone = ops.gemm_q8(x[:1], qp, s, None, group, n, per_token=per_token, symmetric=True)
    assert torch.equal(alone, ops.gemm_q8(x[:1], qp, s, None, group, n, per_token=per_token))
    assert torch.equal(alone, ops.gemm_q8(x, qp, s, None, group, n, per_token=per_token, symmetric=True)[:1])
    assert ops.symmetric_q8(q) and not ops.symmetric_q8(torch.tensor([[0, -128]], dtype=torch.int8))


@pytest.mark.parametrize("per_token", [False, True])
def test_activations_round_to_int8_by_the_scalar_formula_bit_for_bit(per_token: bool) -> None:
    """The kernels' activation rounding (int_tiles.h: quantize_segments, in vectors) is q = round half to even of
    x * (127 / amax), dx = amax / 127, per block of 32 or (W8A8) per row: read back through identity weights, each
    output is one activation's q * dx, so every bit shows. Ties (amax 127: x * inv = x), an all-zero block."""
    m, k = 5, 96
    x = rand(m, k) * 3
    x[0, 0], x[0, 1:32] = 127.0, torch.arange(-15, 16) + 0.5
    x[1, :32] = 0.0
    span = k if per_token else 32
    blocks = x.view(m, -1, span)
    amax = blocks.abs().amax(-1, keepdim=True)
    q = torch.round(blocks * torch.where(amax > 0, 127 / amax, torch.zeros_like(amax)))
    expected = (q * (amax / 127)).view(m, k)
    eye = ops.pack_q8(torch.eye(k, dtype=torch.int8))
    got = ops.gemm_q8(x, eye, ops.pack_tile_scales(torch.ones(k, k // 32)), None, 32, k, per_token=per_token)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("m", [1, 2, 3, 5, 6, 13, 70])
@pytest.mark.parametrize("k", [64, 37])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_panel_gemm_matches_fp32_math_on_the_panels_weights(m: int, k: int, dtype: torch.dtype) -> None:
    w, x, bias = rand(33, k).to(dtype), rand(m, k), rand(33)
    gemm = ops.gemm_f16 if dtype == torch.float16 else ops.gemm_f32
    got = gemm(x, ops.pack_f16(w, dtype), 33, bias)
    torch.testing.assert_close(got, F.linear(x, w.float(), bias), atol=1e-4, rtol=1e-4)


def _clamped_swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:  # GPT-OSS's, at its alpha and limit
    gate = gate.clamp(max=7.0)
    return (up.clamp(-7.0, 7.0) + 1) * (gate * torch.sigmoid(gate * 1.702))


@pytest.mark.parametrize("activation, gated", [
    ("silu", lambda g, u: F.silu(g) * u), ("gelu_tanh", lambda g, u: F.gelu(g, approximate="tanh") * u),
    ("clamped_swiglu", _clamped_swiglu),
])
def test_rms_norm_and_gated_mul(activation: str, gated) -> None:
    x, w = rand(5, 64), rand(64)
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-5), torch.rms_norm(x, (64,), w, 1e-5), atol=1e-5, rtol=1e-5)
    gu = rand(3, 2 * 50)  # 6 vectors of 8 and a scalar tail of 2
    gu[0, :4] = torch.tensor([-100.0, 100.0, -30.0, 90.0])  # exp's clamped range
    gu[0, 48:50] = torch.tensor([-9.0, 1e-3])  # the tail's own arithmetic
    torch.testing.assert_close(ops.gated_mul(gu, activation, 1.702, 7.0), gated(gu[:, :50], gu[:, 50:]), atol=1e-6,
                               rtol=1e-5)
    many = rand(300, 2 * 100)  # a prompt's rows: over the kernels' threads, each row's bits as alone
    assert torch.equal(ops.gated_mul(many, activation, 1.702, 7.0),
                       torch.cat([ops.gated_mul(many[r:r + 1], activation, 1.702, 7.0) for r in range(300)]))


def test_the_read_probe_reads_every_byte_of_whole_chunks_and_a_tail() -> None:
    """Each chunk's fold is the xor of its 8-byte words, the bytes past its last whole 128 xor-ed into the low byte:
    a load skipped anywhere would change it."""
    for nbytes in (100, ops.READ_CHUNK * 3 + 77):  # under one vector loop; three chunks and a ragged fourth
        buf = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(nbytes))
        expected = []
        for chunk in buf.split(ops.READ_CHUNK):
            whole = len(chunk) // 128 * 128
            fold = int(np.bitwise_xor.reduce(chunk[:whole].view(torch.int64).numpy())) if whole else 0
            for b in chunk[whole:].tolist():
                fold ^= b
            expected.append(fold)
        assert ops.read_folds(buf).tolist() == expected
        assert 0 < ops.read_seconds(buf, repeats=2) < float("inf")


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rope_store_rotates_q_k_and_writes_the_cache(cache_dtype: torch.dtype) -> None:
    """The cache gets k and v cast as torch casts them (round to nearest even; fp16 overflows to inf and keeps
    subnormals), so the native and the PyTorch writes of a token leave the same bits."""
    from tally.layers.rotary import RotaryEmbedding, apply_rotary

    hq, hkv, d, t = 4, 2, 16, 3
    qkv = rand(t, (hq + 2 * hkv) * d)
    v_at = (hq + hkv) * d
    qkv[0, v_at:v_at + 8] = torch.tensor([1 + 2 ** -11, 1 + 3 * 2 ** -11, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 65520.0,
                                          3e-6, -0.0, 3.3e38])  # ties for fp16 and bf16, overflow, subnormal
    rope = RotaryEmbedding(d, 64, 10000.0, None, torch.float32)
    positions = torch.tensor([5, 9, 2])
    cos, sin = rope.lookup(positions)
    expected = apply_rotary(qkv[:, :(hq + hkv) * d].view(t, hq + hkv, d), cos, sin)
    k_cache, v_cache = torch.zeros(4, 4, hkv, d, dtype=cache_dtype), torch.zeros(4, 4, hkv, d, dtype=cache_dtype)
    slots = torch.tensor([3, 7, 12])
    got = qkv.clone()
    ops.rope_store(got, cos.squeeze(1).contiguous(), sin.squeeze(1).contiguous(), hq, hkv, d, k_cache, v_cache,
                   slots)
    torch.testing.assert_close(got[:, :(hq + hkv) * d].view(t, hq + hkv, d), expected, atol=1e-5, rtol=1e-5)
    rotated_k = got[:, hq * d:v_at].view(t, hkv, d)
    assert torch.equal(k_cache.view(-1, hkv, d)[slots], rotated_k.to(cache_dtype))
    assert torch.equal(v_cache.view(-1, hkv, d)[slots], qkv[:, v_at:].view(t, hkv, d).to(cache_dtype))


@pytest.mark.parametrize("norms, rotary_dim", [("head", 16), ("whole", 12), ("head", None)])
def test_rope_store_norms_q_and_k_then_rotates_part_or_none_of_each_head(norms: str, rotary_dim: int | None) -> None:
    """q/k norms before the rotation (each head's: Qwen3, Gemma 3; all heads' at once: OLMo 2), partial rotary
    (Phi-4-mini: the first 12 of 16 dimensions) and layers without rotary (None: SmolLM3's NoPE layers)."""
    from tally.layers.rotary import RotaryEmbedding

    hq, hkv, d, t, eps = 4, 2, 16, 3, 1e-6
    qkv = rand(t, (hq + 2 * hkv) * d) * 3
    q_w, k_w = (rand(d), rand(d)) if norms == "head" else (rand(hq * d), rand(hkv * d))
    q, k = qkv[:, :hq * d], qkv[:, hq * d:(hq + hkv) * d]
    if norms == "head":
        q = torch.rms_norm(q.view(t, hq, d), (d,), q_w, eps)
        k = torch.rms_norm(k.view(t, hkv, d), (d,), k_w, eps)
    else:
        q = torch.rms_norm(q, (hq * d,), q_w, eps).view(t, hq, d)
        k = torch.rms_norm(k, (hkv * d,), k_w, eps).view(t, hkv, d)
    expected = torch.cat([q, k], dim=1)
    cos = sin = None
    if rotary_dim is not None:
        rope = RotaryEmbedding(d, 64, 10000.0, None, torch.float32, rotary_dim)
        cos, sin = rope.lookup(torch.tensor([5, 9, 2]))
        expected = rope.rotate(expected, (cos, sin))
        cos, sin = cos.squeeze(1).contiguous(), sin.squeeze(1).contiguous()
    k_cache, v_cache = torch.zeros(4, 4, hkv, d), torch.zeros(4, 4, hkv, d)
    slots = torch.tensor([3, 7, 12])
    got = qkv.clone()
    ops.rope_store(got, cos, sin, hq, hkv, d, k_cache, v_cache, slots, q_w, k_w, norms == "whole", eps)
    torch.testing.assert_close(got[:, :(hq + hkv) * d].view(t, hq + hkv, d), expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(k_cache.view(-1, hkv, d)[slots], got[:, hq * d:(hq + hkv) * d].view(t, hkv, d))


def test_decode_attention_soft_caps_scores_as_gemma_2() -> None:
    """scores = cap * tanh(scores / cap) before the softmax, against the PyTorch softcapped attention; scores both
    small and large (tanh's two forms)."""
    from tally.attention.eager import eager_attention

    hq, hkv, d, bs, cap = 4, 2, 16, 4, 5.0
    k_cache, v_cache = rand(10, bs, hkv, d) * 3, rand(10, bs, hkv, d)
    tables = torch.tensor([[3, 1, 7, 0], [9, 2, 0, 0]])
    lens = torch.tensor([13, 6])
    q = rand(2, hq, d) * 2
    got = ops.decode_attention(q, k_cache, v_cache, tables, lens, None, 0.25, cap)
    for b in range(2):
        slots = torch.cat([tables[b, i // bs:i // bs + 1] * bs + i % bs for i in range(int(lens[b]))])
        k, v = (c.view(-1, hkv, d)[slots].transpose(0, 1)[None] for c in (k_cache, v_cache))
        ref = eager_attention(q[b][None, :, None], k, v, None, 0.25, cap)
        torch.testing.assert_close(got[b], ref[0, :, 0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [None, 5])
def test_decode_attention_matches_sdpa_over_gathered_keys(window: int | None) -> None:
    hq, hkv, d, bs = 6, 2, 16, 4
    k_cache, v_cache = rand(10, bs, hkv, d), rand(10, bs, hkv, d)
    tables = torch.tensor([[3, 1, 7, 0], [9, 2, 0, 0]])
    lens = torch.tensor([13, 6])
    q = rand(2, hq, d)
    got = ops.decode_attention(q, k_cache, v_cache, tables, lens, window, 0.25)
    for b in range(2):
        slots = torch.cat([tables[b, i // bs:i // bs + 1] * bs + i % bs for i in range(int(lens[b]))])
        start = 0 if window is None else max(0, int(lens[b]) - window)
        k = k_cache.view(-1, hkv, d)[slots[start:]].repeat_interleave(hq // hkv, 1)
        v = v_cache.view(-1, hkv, d)[slots[start:]].repeat_interleave(hq // hkv, 1)
        ref = F.scaled_dot_product_attention(q[b][:, None], k.transpose(0, 1), v.transpose(0, 1), scale=0.25)
        torch.testing.assert_close(got[b], ref[:, 0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [None, 12, 40])
def test_decode_attention_rows_of_one_sequence_give_each_rows_own_bits(window: int | None) -> None:
    """A verify step's rows (one sequence's next positions, the same blocks) read each key once for all of them; every
    row's output is still the bits of that row attended alone, with windows that some rows pass and some do not,
    beside a row of another sequence, and over contexts that end inside a block of 8 keys."""
    hq, hkv, d, bs = 6, 2, 32, 4
    k_cache, v_cache = rand(20, bs, hkv, d), rand(20, bs, hkv, d)
    table = [5, 11, 2, 19, 7, 0, 13, 4, 16, 9, 1, 14]
    tables = torch.tensor([table] * 9 + [[3, 8, 6, 12, 17, 10, 15, 18, 0, 0, 0, 0]])
    lens = torch.tensor([35 + i for i in range(9)] + [29])
    q = rand(10, hq, d)
    together = ops.decode_attention(q, k_cache, v_cache, tables, lens, window, 0.2)
    for r in range(10):
        alone = ops.decode_attention(q[r:r + 1], k_cache, v_cache, tables[r:r + 1], lens[r:r + 1], window, 0.2)
        assert torch.equal(together[r], alone[0]), r


@pytest.mark.parametrize("window", [None, 100, 300])
def test_decode_attention_over_several_chunks_matches_sdpa_and_each_row_alone(window: int | None) -> None:
    """Long contexts are cut into chunks of 128 keys (items for the threads, combined per row): rows of one sequence
    whose contexts cross a chunk's end, and a row of another sequence, each match SDPA over their gathered keys and
    give the bits they give alone."""
    hq, hkv, d, bs = 6, 2, 32, 16
    blocks = 40
    k_cache, v_cache = rand(blocks, bs, hkv, d), rand(blocks, bs, hkv, d)
    table = torch.randperm(blocks, generator=gen)
    tables = torch.stack([table] * 6 + [table.flip(0)])
    lens = torch.tensor([252 + i for i in range(6)] + [141])  # 252..257 cross the second chunk's end at 256
    q = rand(7, hq, d)
    together = ops.decode_attention(q, k_cache, v_cache, tables, lens, window, 0.2)
    for r in range(7):
        alone = ops.decode_attention(q[r:r + 1], k_cache, v_cache, tables[r:r + 1], lens[r:r + 1], window, 0.2)
        assert torch.equal(together[r], alone[0]), r
        length = int(lens[r])
        slots = torch.tensor([int(tables[r, i // bs]) * bs + i % bs for i in range(length)])
        start = 0 if window is None else max(0, length - window)
        k, v = (c.view(-1, hkv, d)[slots[start:]].double().repeat_interleave(hq // hkv, 1) for c in (k_cache, v_cache))
        ref = F.scaled_dot_product_attention(q[r].double()[:, None], k.transpose(0, 1), v.transpose(0, 1), scale=0.2)
        torch.testing.assert_close(together[r], ref[:, 0].float(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("cache_dtype", [torch.float16, torch.bfloat16])
def test_attention_over_a_16_bit_cache_gives_the_bits_of_its_values_in_fp32(cache_dtype: torch.dtype) -> None:
    """fp16 and bf16 caches are read in place and widened as they load: decode rows (one sequence's rows across a
    chunk's end, another sequence's row, with and without a window) and a prompt chunk after cached keys give
    exactly what the kernels give over an fp32 cache holding the same values."""
    hq, hkv, d, bs, blocks = 6, 2, 32, 16, 24
    k16, v16 = rand(blocks, bs, hkv, d).to(cache_dtype), rand(blocks, bs, hkv, d).to(cache_dtype)
    k32, v32 = k16.float(), v16.float()
    table = torch.randperm(blocks, generator=gen)
    tables = torch.stack([table] * 4 + [table.flip(0)])
    lens = torch.tensor([126, 127, 128, 129, 200])
    q = rand(5, hq, d)
    for window in (None, 50):
        assert torch.equal(ops.decode_attention(q, k16, v16, tables, lens, window, 0.2),
                           ops.decode_attention(q, k32, v32, tables, lens, window, 0.2))
        chunk = rand(37, hq + 2 * hkv, d)[:, :hq]
        assert torch.equal(ops.prefill_attention(chunk, k16, v16, table, 100, window, 0.3),
                           ops.prefill_attention(chunk, k32, v32, table, 100, window, 0.3))


def _prefill_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, table: torch.Tensor,
                       first_pos: int, window: int | None, scale: float, softcap: float | None = None,
                       sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Every row of q (positions first_pos..) against the keys it may see, gathered, in float64 eager attention (soft
    caps and sinks as transformers computes them)."""
    from tally.attention.eager import eager_attention

    n, hq, d = q.shape
    hkv, bs, end = k_cache.shape[2], k_cache.shape[1], first_pos + q.shape[0]
    slots = torch.tensor([int(table[p // bs]) * bs + p % bs for p in range(end)])
    k, v = (c.view(-1, hkv, d)[slots].double().transpose(0, 1)[None] for c in (k_cache, v_cache))
    query_pos, key_pos = torch.arange(first_pos, end)[:, None], torch.arange(end)[None, :]
    visible = key_pos <= query_pos
    if window is not None:
        visible &= key_pos > query_pos - window
    out = eager_attention(q.double().transpose(0, 1)[None], k, v, visible, scale, softcap,
                          None if sinks is None else sinks.double())
    return out[0].transpose(0, 1).float()


@pytest.mark.parametrize(("n", "first_pos", "hq", "hkv", "d", "bs", "window"), [
    (37, 0, 6, 2, 64, 4, None),    # a whole prompt: a last tile of 5 rows, one of 5 keys
    (37, 0, 6, 2, 64, 4, 9),       # a window shorter than a key tile
    (20, 13, 4, 4, 40, 8, None),   # a chunk after 13 cached tokens; 40 dims: a last pass of 8
    (50, 30, 7, 1, 128, 16, 17),   # 7 query heads a kv head (Qwen 0.5B's group); a window inside the chunk
    (1, 5, 2, 1, 8, 4, None),      # one row
    (70, 0, 9, 3, 64, 16, 200),    # SmolLM2's heads; a window longer than the prompt
])
@pytest.mark.parametrize(("softcap", "with_sinks"), [(None, False), (2.0, False), (None, True), (2.0, True)])
def test_prefill_attention_matches_eager_attention_over_gathered_keys(n: int, first_pos: int, hq: int, hkv: int,
                                                                      d: int, bs: int, window: int | None,
                                                                      softcap: float | None,
                                                                      with_sinks: bool) -> None:
    """Plain, soft-capped (Gemma 2; a cap that bends these scores) and sink-weighted (GPT-OSS: sinks both above
    and below a row's scores) attention."""
    blocks = (first_pos + n + bs - 1) // bs + 3
    k_cache, v_cache = rand(blocks, bs, hkv, d), rand(blocks, bs, hkv, d)
    table = torch.randperm(blocks, generator=gen)
    qkv = rand(n, hq + 2 * hkv, d)
    q = qkv[:, :hq]  # rows strided, as a fused projection's output is
    sinks = rand(hq) * 4 if with_sinks else None
    got = ops.prefill_attention(q, k_cache, v_cache, table, first_pos, window, 0.3, softcap, sinks)
    want = _prefill_reference(q, k_cache, v_cache, table, first_pos, window, 0.3, softcap, sinks)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [None, 9, 40])
@pytest.mark.parametrize(("softcap", "with_sinks"), [(None, False), (2.0, False), (None, True)])
def test_prefill_attention_rows_keep_their_bits_however_the_prompt_is_split(window: int | None,
                                                                           softcap: float | None,
                                                                           with_sinks: bool) -> None:
    """A prompt in one call, in 16-row chunks, in chunks of 7 (tiles of rows and of keys cut elsewhere, windows that
    start inside a key tile) and a row at a time: every row the same bits."""
    hq, hkv, d, bs, n = 4, 2, 32, 4, 75
    blocks = n // bs + 4
    k_cache, v_cache = rand(blocks, bs, hkv, d), rand(blocks, bs, hkv, d)
    table = torch.randperm(blocks, generator=gen)
    q, sinks = rand(n, hq, d), rand(hq) * 4 if with_sinks else None
    whole = ops.prefill_attention(q, k_cache, v_cache, table, 0, window, 0.3, softcap, sinks)
    for size in (16, 7, 1):
        parts = [ops.prefill_attention(q[a:a + size], k_cache, v_cache, table, a, window, 0.3, softcap, sinks)
                 for a in range(0, n, size)]
        assert torch.equal(torch.cat(parts), whole), size


def test_threaded_kernels_give_the_single_thread_bits() -> None:
    """Large enough calls split their outputs over the kernels' threads (tally/native/pool.h, as many as torch's
    count: a share each, in pieces that a thread done with its own takes from the others' ends); every output is
    still computed by one thread in one order, so the bits do not depend on the count. 3 and 4 threads on fewer cores
    cut the work in more shares than run at once, so pieces change hands. The helpers' count of pieces run shows the
    work was split: on a loaded machine the pool may keep the caller alone a while after a late helper, so the calls
    are repeated until helpers took some."""
    n, k = 512, 1024
    x = rand(3, k)
    q4 = ops.pack_q4(torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=gen))
    d, m = ops.pack_tile_scales(rand(n, k // 32).abs()), ops.pack_tile_scales(rand(n, k // 32))
    q6, qh = ops.pack_planes(torch.randint(0, 64, (n, k), dtype=torch.uint8, generator=gen), 6)
    d16 = ops.pack_tile_scales(rand(n, k // 16).abs())
    q8 = ops.pack_q8(torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen))
    s = ops.pack_tile_scales(rand(n, 1).abs())
    panels = ops.pack_f16(rand(n, k))
    kc, vc = rand(64, 16, 4, 64), rand(64, 16, 4, 64)
    tables, lens, q = torch.arange(64).view(2, 32), torch.tensor([500, 300]), rand(2, 8, 64)
    prompt = rand(300, 8, 64)  # the last 300 tokens of a 500-token sequence: tiles of 16 rows, a head at a time
    k1, v1, q1 = kc[:, :, :1].contiguous(), vc[:, :, :1].contiguous(), rand(1, 8, 64)  # one chunk: heads split

    def run_all() -> list[torch.Tensor]:
        return [ops.gemm_q4(x, q4, d, m, None, 32, n), ops.gemm_q4(x, q6, d16, None, None, 16, n, qh=qh),
                ops.gemm_q8(x, q8, s, None, k, n), ops.gemm_f16(x, panels, n, None),
                ops.decode_attention(q, kc, vc, tables, lens, None, 0.125),
                ops.decode_attention(q1, k1, v1, tables[:1], torch.tensor([100]), None, 0.125),
                ops.prefill_attention(prompt, kc, vc, tables[0], 200, None, 0.125),
                # a 16-row chunk after 484 tokens: tiles of 16, 8 or 4 rows and 1 to 4 heads a pass by thread count
                ops.prefill_attention(prompt[:16], kc, vc, tables[0], 484, None, 0.125)]

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run_all()
        for threads in (2, 3, 4):
            torch.set_num_threads(threads)
            pieces, deadline = ops.pool_helper_pieces(), time.monotonic() + 60
            while True:
                for a, b in zip(one, run_all()):
                    assert torch.equal(a, b)
                if ops.pool_helper_pieces() > pieces or time.monotonic() > deadline:
                    break
            assert ops.pool_helper_pieces() > pieces, f"no helper thread ran any work in 60 s at {threads} threads"
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("bits,group", [(4, 32), (5, 32), (6, 16), (8, 32)])
def test_a_rows_bits_do_not_depend_on_the_rows_called_with_it(bits: int, group: int) -> None:
    """A prompt's rows and a decode step's row take different loops (int5 / int6: tiles unpacked once a call for
    more than 4 rows, int_tiles.h: tile_rows; int8 tiles within +-16 add a block up in int16 then), and each row of a
    70-row call (a 64-row pass and 6 more) still gets the bits it gets alone, so chunking and batching never change a
    token."""
    n, k = 44, 192
    x = rand(70, k)
    if bits == 8:
        q = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
        q[:16] = torch.randint(-16, 17, (16, k), dtype=torch.int8, generator=gen)  # two narrow tiles, ±16 in them
        q[0, :2] = torch.tensor([-16, 16])
        q8, s = ops.pack_q8(q), rand(n, k // group)
        call = lambda rows: ops.gemm_q8(rows, q8, ops.pack_tile_scales(s.abs()), None, group, n)  # noqa: E731
    else:
        q = torch.randint(0, 1 << bits, (n, k), dtype=torch.uint8, generator=gen)
        qs, qh = ops.pack_planes(q, bits) if bits > 4 else (ops.pack_q4(q), None)
        d = ops.pack_tile_scales(rand(n, k // group).abs())
        m = ops.pack_tile_scales(rand(n, k // group)) if bits == 4 else None
        call = lambda rows: ops.gemm_q4(rows, qs, d, m, None, group, n, qh=qh)  # noqa: E731
    together = call(x)
    for r in (0, 3, 4, 5, 63, 64, 69):
        assert torch.equal(together[r:r + 1], call(x[r:r + 1])), r
    assert torch.equal(together[60:65], call(x[60:65]))  # five rows: a pass of 4 and one


def _threaded_q4_case() -> tuple:
    n, k = 1024, 1024
    x = rand(2, k)
    q4 = ops.pack_q4(torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=gen))
    d, m = ops.pack_tile_scales(rand(n, k // 32).abs()), ops.pack_tile_scales(rand(n, k // 32))
    return x, q4, d, m, n


def test_two_python_threads_calling_at_once_get_their_own_results() -> None:
    """One caller holds the kernels' threads at a time; a second one (another Python thread: ctypes lets go of the
    GIL) runs its loop alone meanwhile, and both get the bits of a call made alone."""
    x, q4, d, m, n = _threaded_q4_case()
    x2 = x.flip(1).contiguous()
    want = [ops.gemm_q4(x, q4, d, m, None, 32, n), ops.gemm_q4(x2, q4, d, m, None, 32, n)]
    got: list[list[bool]] = [[], []]

    def hammer(i: int, xi: torch.Tensor) -> None:
        for _ in range(200):
            got[i].append(torch.equal(ops.gemm_q4(xi, q4, d, m, None, 32, n), want[i]))

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        threads = [threading.Thread(target=hammer, args=(i, xi)) for i, xi in enumerate([x, x2])]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        torch.set_num_threads(before)
    assert got[0] == [True] * 200 and got[1] == [True] * 200


def test_a_forked_child_computes_without_the_parents_threads() -> None:
    """A child of fork() has none of its parent's helper threads; its calls still finish, with the same bits."""
    x, q4, d, m, n = _threaded_q4_case()
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        want = ops.gemm_q4(x, q4, d, m, None, 32, n)  # the parent's helpers exist now
        pid = os.fork()
        if pid == 0:  # the child: exit 0 only with the parent's bits
            os._exit(0 if torch.equal(ops.gemm_q4(x, q4, d, m, None, 32, n), want) else 1)
        status = None
        for _ in range(600):  # a child waiting for helpers it does not have would hang: fail instead, after 60 s
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.1)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            status = None
    finally:
        torch.set_num_threads(before)
    assert status is not None and os.waitstatus_to_exitcode(status) == 0
