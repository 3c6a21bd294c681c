"""int8 KV cache: the write path (a scale per token and head, so a token's bits do not depend on what was written
with it) and every attention read path against the same steps over an fp32 cache and the dense oracle."""
from __future__ import annotations

import pytest
import torch
from test_attention import BACKENDS, build
from test_attention_toy import PagedKV, dense_oracle, random_seq

from tally.attention import AttentionConfig
from tally.attention.kv_cache import (
    Int8KVCache,
    dequantize_blocks,
    write_int8,
)
from tally.attention.reference import ReferenceBackend

# Relative error (Frobenius) of attention outputs allowed for int8 K/V against fp32 K/V.
MAX_REL_ERR = 0.02


def rel_err(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got.double() - expected.double()).norm() / expected.double().norm())


def empty_cache(num_blocks: int = 8, block_size: int = 4, heads: int = 2, dim: int = 8) -> Int8KVCache:
    shape = (num_blocks, block_size, heads, dim)
    return Int8KVCache(torch.randint(-127, 128, shape, dtype=torch.int8), torch.full(shape[:3], 1e9))


def write(cache: Int8KVCache, x: torch.Tensor, slots: list[int]) -> None:
    slot_mapping = torch.tensor(slots, dtype=torch.int64)
    write_int8(cache, x, slot_mapping)


def read_block(cache: Int8KVCache, block: int) -> torch.Tensor:
    return dequantize_blocks(cache, torch.tensor([block]), torch.float32)[0]


def test_each_token_and_head_is_stored_on_its_own_scale():
    gen = torch.Generator().manual_seed(0)
    cache = empty_cache()
    x = torch.randn(4, 2, 8, generator=gen)
    x[3, 0] *= 50  # head 0's last token far larger: the others keep their own steps
    write(cache, x, [20, 21, 22, 23])
    scale = x.abs().amax(dim=2) / 127
    torch.testing.assert_close(cache.scales[5], scale)
    assert ((read_block(cache, 5) - x).abs() <= scale[..., None] / 2 + 1e-6).all()


def test_a_token_leaves_the_same_bits_written_alone_in_a_chunk_or_beside_others():
    """What makes the int8 cache batch-invariant: a prompt written in one pass, in chunks, or a token a step (decode),
    beside other requests' tokens or not, leaves bitwise the same values and scales (tests/test_batch_invariance.py
    checks the engine)."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 2, 8, generator=gen) * torch.tensor([0.1, 0.5, 2.0, 8.0])[:, None, None]
    other = torch.randn(3, 2, 8, generator=gen) * 100
    stepwise, at_once, beside = empty_cache(), empty_cache(), empty_cache()
    for pos in range(4):
        write(stepwise, x[pos:pos + 1], [12 + pos])
    write(at_once, x, [12, 13, 14, 15])
    write(beside, torch.cat([other[:2], x[:3], other[2:]]), [4, 5, 12, 13, 14, 30])
    write(beside, x[3:], [15])
    for cache in (stepwise, beside):
        assert torch.equal(cache.values[3], at_once.values[3]) and torch.equal(cache.scales[3], at_once.scales[3])


def test_scales_are_never_one_global_scale():
    gen = torch.Generator().manual_seed(2)
    cache = empty_cache()
    big, small = torch.randn(4, 2, 8, generator=gen) * 1000, torch.randn(4, 2, 8, generator=gen)
    write(cache, torch.cat([big, small]), [8, 9, 10, 11, 24, 25, 26, 27])  # blocks 2 and 6 in one step
    assert rel_err(read_block(cache, 6), small) < 0.01
    assert rel_err(read_block(cache, 2), big) < 0.01


def _int8_and_fp32(name, rows, hq, hkv, d, block_size, window=None):
    """The same step over an fp32 and an int8 toy cache (same block placement); outputs of each."""
    outs = []
    for dtype in (torch.float32, torch.int8):
        kv = PagedKV(hkv, d, block_size, dtype=dtype)
        outs.append(torch.cat(kv.step(build(name, hq, hkv, d, window), rows)))
    return outs


def _oracle(rows, d, window):
    return torch.cat([dense_oracle(s, c, n, scale=d ** -0.5, window=window) for s, c, n in rows])


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 2), (4, 1)])
def test_int8_prefill_and_decode_match_fp32_kv(name, hq, hkv):
    gen = torch.Generator().manual_seed(4)
    d = 64
    rows = [(random_seq(ctx, hq, hkv, d, gen), ctx - 1, 1) for ctx in (1, 9, 33, 70)]
    rows += [(random_seq(37, hq, hkv, d, gen), 0, 37), (random_seq(22, hq, hkv, d, gen), 13, 9)]
    int8, fp32 = _int8_and_fp32(name, rows, hq, hkv, d, 16)[::-1]
    assert not int8.isnan().any()  # no stale slot or scale was read
    assert rel_err(int8, fp32) < MAX_REL_ERR
    assert rel_err(int8, _oracle(rows, d, None)) < MAX_REL_ERR


@pytest.mark.parametrize("name", BACKENDS)
def test_int8_sliding_window_and_prefix_hits_match_fp32_kv(name):
    gen = torch.Generator().manual_seed(5)
    rows = [(random_seq(ctx, 4, 2, 16, gen), ctx - 1, 1) for ctx in (5, 12, 13, 50)]
    rows += [(random_seq(c + n, 4, 2, 16, gen), c, n) for c, n in ((0, 13), (0, 50), (30, 7), (32, 5))]
    int8, fp32 = _int8_and_fp32(name, rows, 4, 2, 16, 4, window=12)[::-1]
    assert rel_err(int8, fp32) < MAX_REL_ERR
    assert rel_err(int8, _oracle(rows, 16, 12)) < MAX_REL_ERR


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("window", [None, 12])
def test_int8_chunked_prefill_then_decodes_with_growing_values_match_fp32_kv(name, window):
    """Magnitudes grow along the sequence, so later tokens keep outgrowing their block's scale and
    every block is requantized while it fills, across chunks and decode steps."""
    gen = torch.Generator().manual_seed(6)
    seq = random_seq(53, 4, 2, 16, gen)
    ramp = torch.linspace(0.1, 4.0, 53)[:, None, None]
    seq.k, seq.v = seq.k * ramp, seq.v * ramp
    backend = build(name, 4, 2, 16, window)
    outs = {}
    for dtype in (torch.float32, torch.int8):
        kv, chunks = PagedKV(2, 16, 8, dtype=dtype), []
        for start in range(0, 45, 7):  # chunks of 7, not block aligned
            chunks += kv.step(backend, [(seq, start, min(7, 45 - start))], prewrite=False)
        for pos in range(45, 53):
            chunks += kv.step(backend, [(seq, pos, 1)], prewrite=False)
        outs[dtype] = torch.cat(chunks)
    assert rel_err(outs[torch.int8], outs[torch.float32]) < MAX_REL_ERR


def test_int8_decode_rows_split_into_groups_match_fp32_kv():
    gen = torch.Generator().manual_seed(7)
    rows = [(random_seq(ctx, 4, 2, 16, gen), ctx - 1, 1) for ctx in (3, 40, 9, 70, 1, 33, 64, 16)]
    backend = ReferenceBackend(AttentionConfig(4, 2, 16, 0.25, None), decode_gather_keys=70)
    fp32, int8 = (torch.cat(PagedKV(2, 16, 4, dtype=dtype).step(backend, rows))
                  for dtype in (torch.float32, torch.int8))
    assert rel_err(int8, fp32) < MAX_REL_ERR
