"""A native layer adds its projection into the residual stream as the kernel stores it (QuantLinear.add_to, used by
DecoderLayer._add_block as the one-call decode step's add_block does): the sum must be the bits of `h + layer(x)`,
on the kernel's path, on the many-token path and for W8A8's smoothed rows; and the prompt's row-parallel small
kernels (norms, rotary) give each row the bits it gets alone."""
from __future__ import annotations

import pytest
import torch

from tally.native import ops
from tally.quant.native_linear import NativeInt4Linear, NativeInt8Linear, NativeTableLinear, NativeW8A8Linear

pytestmark = pytest.mark.skipif(not ops.available(), reason="native kernels need AVX2 and a C compiler")

gen = torch.Generator().manual_seed(7)
N, K = 40, 128  # 5 tiles of 8 outputs: an odd pair's last tile alone


def rand(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen)


def layers() -> dict[str, torch.nn.Module]:
    bias = rand(N)
    q4 = torch.randint(0, 16, (N, K), dtype=torch.uint8, generator=gen)
    q6 = torch.randint(0, 64, (N, K), dtype=torch.uint8, generator=gen)
    q8 = torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=gen)
    table = torch.tensor([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113])
    return {
        "int4 with minima, bias": NativeInt4Linear(q4, rand(N, K // 32).abs(), rand(N, K // 32), 32, bias),
        "int6 (Q6_K)": NativeInt4Linear(q6, rand(N, K // 16).abs(), None, 16, None, bits=6),
        "LUT4 (IQ4_NL)": NativeTableLinear(q4, rand(N, K // 32).abs(), table, None),
        "int8 (Q8_0), bias": NativeInt8Linear(q8, rand(N, K // 32).abs(), bias),
        "W8A8, smoothed": NativeW8A8Linear(q8, rand(N).abs(), None, smooth=rand(K).abs() + 0.5),
    }


@pytest.mark.parametrize("name", list(layers()))
@pytest.mark.parametrize("rows", [1, 7, 40])
def test_add_to_gives_the_bits_of_the_residual_plus_the_layer(name: str, rows: int) -> None:
    layer = layers()[name]
    x, h = rand(rows, K), rand(rows, N)
    expected = h + layer(x)
    out = h.clone()
    assert layer.add_to(x, out) is out
    assert torch.equal(out, expected)
    layer.many_tokens_from = 1  # the bf16 many-token path: a plain add after it
    out = h.clone()
    layer.add_to(x, out)
    assert torch.equal(out, h + layer(x))


def test_a_strided_residual_takes_a_plain_add() -> None:
    layer = layers()["int4 with minima, bias"]
    x, wide = rand(5, K), rand(5, 2 * N)
    h = wide[:, :N]  # rows 2N floats apart: the kernel writes contiguous rows only
    expected = h + layer(x)
    layer.add_to(x, h)
    assert torch.equal(h, expected)


def test_a_prompts_norms_and_rotary_give_each_row_its_own_bits() -> None:
    """tally_rms_norm and tally_rope_store split a prompt's rows over the kernels' threads."""
    x, w = rand(300, 256), rand(256)
    assert torch.equal(ops.rms_norm(x, w, 1e-6), torch.cat([ops.rms_norm(x[r:r + 1], w, 1e-6) for r in range(300)]))
    hq, hkv, d, t = 8, 2, 64, 300
    qkv = rand(t, (hq + 2 * hkv) * d)
    cos, sin = rand(t, d), rand(t, d)
    q_norm, k_norm = rand(d), rand(d)
    caches = [torch.zeros(t, 1, hkv, d, dtype=torch.float16) for _ in range(4)]
    slots = torch.randperm(t, generator=gen)
    whole = qkv.clone()
    ops.rope_store(whole, cos, sin, hq, hkv, d, caches[0], caches[1], slots, q_norm, k_norm, eps=1e-6)
    alone = qkv.clone()
    for r in range(t):
        ops.rope_store(alone[r:r + 1], cos[r:r + 1], sin[r:r + 1], hq, hkv, d, caches[2], caches[3], slots[r:r + 1],
                       q_norm, k_norm, eps=1e-6)
    assert torch.equal(whole, alone)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
