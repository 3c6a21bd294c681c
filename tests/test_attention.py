"""Both attention backends against a dense float64 oracle over a toy paged cache."""
from __future__ import annotations

import pytest
import torch
from test_attention_toy import PagedKV, dense_oracle, random_seq

from tally.attention import AttentionConfig, make_backend
from tally.attention.backend import with_sinks
from tally.attention.reference import ReferenceBackend
from tally.attention.tiled import TiledBackend
from tally.errors import ConfigError, TallyError

# "tiled_small" uses tiny tiles so short test sequences still cross many query and key tiles.
BACKENDS = ["reference", "tiled", "tiled_small", "auto"]


def build(name: str, hq: int, hkv: int, d: int, window: int | None = None, sinks: torch.Tensor | None = None):
    if name == "tiled_small":
        config = AttentionConfig(hq, hkv, d, d ** -0.5, window, sinks=None if sinks is None else tuple(sinks.tolist()))
        return TiledBackend(config, query_tile=8, key_tile=8)
    backend = make_backend(name, num_heads=hq, num_kv_heads=hkv, head_dim=d, scale=d ** -0.5, sliding_window=window)
    return backend if sinks is None else with_sinks(backend, sinks)


def check_rows(outs, rows, d, window, atol=1e-5, kv_dtype=torch.float32):
    for out, (seq, computed, new) in zip(outs, rows):
        expected = dense_oracle(seq, computed, new, scale=d ** -0.5, window=window, kv_dtype=kv_dtype)
        torch.testing.assert_close(out.double(), expected, atol=atol, rtol=0)


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("d,block_size", [(64, 16), (16, 4)])
def test_prefill_matches_dense_oracle(name, hq, hkv, d, block_size):
    gen = torch.Generator().manual_seed(0)
    kv = PagedKV(hkv, d, block_size)
    rows = [(random_seq(37, hq, hkv, d, gen), 0, 37), (random_seq(5, hq, hkv, d, gen), 0, 5)]
    check_rows(kv.step(build(name, hq, hkv, d), rows), rows, d, None)


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("block_size", [16, 4])
def test_decode_batch_matches_dense_oracle(name, block_size):
    gen = torch.Generator().manual_seed(1)
    kv = PagedKV(2, 16, block_size)
    rows = [(random_seq(ctx, 4, 2, 16, gen), ctx - 1, 1) for ctx in (1, 9, 33, 64, 16)]
    check_rows(kv.step(build(name, 4, 2, 16), rows), rows, 16, None)


@pytest.mark.parametrize("window", [None, 12])
def test_decode_rows_split_into_groups_by_a_small_gather_budget_match_dense_oracle(window):
    gen = torch.Generator().manual_seed(10)
    kv = PagedKV(2, 16, 4)
    rows = [(random_seq(ctx, 4, 2, 16, gen), ctx - 1, 1) for ctx in (3, 40, 9, 70, 1, 33, 64, 16)]
    backend = ReferenceBackend(AttentionConfig(4, 2, 16, 0.25, window), decode_gather_keys=70)
    check_rows(kv.step(backend, rows), rows, 16, window)


@pytest.mark.parametrize("name", BACKENDS)
def test_mixed_batch_of_decodes_chunks_and_prefix_hits_matches_dense_oracle(name):
    gen = torch.Generator().manual_seed(2)
    kv = PagedKV(1, 16, 4)
    rows = [
        (random_seq(10, 4, 1, 16, gen), 9, 1),    # decodes first
        (random_seq(40, 4, 1, 16, gen), 39, 1),
        (random_seq(22, 4, 1, 16, gen), 13, 9),   # a middle chunk, not block aligned
        (random_seq(20, 4, 1, 16, gen), 0, 20),   # a fresh prefill
        (random_seq(37, 4, 1, 16, gen), 32, 5),   # the tail after a 32-token prefix-cache hit
    ]
    check_rows(kv.step(build(name, 4, 1, 16), rows), rows, 16, None)


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("window", [None, 12])
def test_attention_sinks_join_each_softmax_denominator_in_every_backend(name, window):
    # GPT-OSS: one learned logit per query head, as a key with no value; decodes, a chunk, a prefix hit, a prompt
    gen = torch.Generator().manual_seed(11)
    sinks = torch.tensor([2.0, -1.0, 0.5, 4.0])
    kv = PagedKV(2, 16, 4)
    rows = [(random_seq(10, 4, 2, 16, gen), 9, 1), (random_seq(40, 4, 2, 16, gen), 39, 1),
            (random_seq(22, 4, 2, 16, gen), 13, 9), (random_seq(37, 4, 2, 16, gen), 32, 5),
            (random_seq(30, 4, 2, 16, gen), 0, 30)]
    outs = kv.step(build(name, 4, 2, 16, window, sinks), rows)
    for out, (seq, computed, new) in zip(outs, rows):
        expected = dense_oracle(seq, computed, new, scale=0.25, window=window, sinks=sinks)
        torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("window", [None, 12])
def test_chunked_prefill_in_chunks_of_7_matches_unchunked(name, window):
    gen = torch.Generator().manual_seed(3)
    seq = random_seq(45, 4, 2, 16, gen)
    backend = build(name, 4, 2, 16, window)
    whole = PagedKV(2, 16, 4, seed=1).step(backend, [(seq, 0, 45)])[0]
    chunked_kv, chunks = PagedKV(2, 16, 4, seed=2), []
    for start in range(0, 45, 7):
        # prewrite=False: the earlier chunks' K/V are in the cache only because forward wrote them.
        chunks += chunked_kv.step(backend, [(seq, start, min(7, 45 - start))], prewrite=False)
    torch.testing.assert_close(torch.cat(chunks), whole, atol=1e-5, rtol=0)
    check_rows([whole], [(seq, 0, 45)], 16, window)


@pytest.mark.parametrize("name", BACKENDS)
def test_sliding_window_with_contexts_shorter_and_longer_than_window(name):
    gen = torch.Generator().manual_seed(4)
    kv = PagedKV(2, 16, 4)
    decodes = [(random_seq(ctx, 4, 2, 16, gen), ctx - 1, 1) for ctx in (5, 12, 13, 50)]
    prefills = [(random_seq(computed + new, 4, 2, 16, gen), computed, new)
                for computed, new in ((0, 5), (0, 12), (0, 13), (0, 50), (30, 7), (3, 9))]
    rows = decodes + prefills
    check_rows(kv.step(build(name, 4, 2, 16, window=12), rows), rows, 16, window=12)


@pytest.mark.parametrize("name", BACKENDS)
def test_output_does_not_depend_on_where_blocks_live(name):
    gen = torch.Generator().manual_seed(5)
    seqs = [random_seq(n, 4, 2, 16, gen) for n in (30, 19)]
    outs = []
    for seed in (1, 2):
        kv = PagedKV(2, 16, 4, seed=seed)
        kv.free.sort(reverse=seed == 1)  # seed 1: blocks 1, 2, 3... in order; seed 2: shuffled
        outs.append(torch.cat(kv.step(build(name, 4, 2, 16), [(seqs[0], 29, 1), (seqs[1], 7, 12)])))
    torch.testing.assert_close(outs[0], outs[1], atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", BACKENDS)
def test_bf16_cache_matches_oracle_on_bf16_rounded_kv(name):
    gen = torch.Generator().manual_seed(6)
    kv = PagedKV(2, 64, 16, dtype=torch.bfloat16)
    rows = [(random_seq(25, 4, 2, 64, gen), 24, 1), (random_seq(40, 4, 2, 64, gen), 17, 23)]
    outs = kv.step(build(name, 4, 2, 64), rows)
    check_rows(outs, rows, 64, None, kv_dtype=torch.bfloat16)  # the math itself stays fp32
    check_rows(outs, rows, 64, None, atol=3e-2)  # bf16 storage error against exact K/V


@pytest.mark.parametrize("name", BACKENDS)
def test_output_dtype_follows_q(name):
    gen = torch.Generator().manual_seed(7)
    seq = random_seq(9, 4, 2, 16, gen)
    seq.q, seq.k, seq.v = seq.q.bfloat16(), seq.k.bfloat16(), seq.v.bfloat16()
    out = PagedKV(2, 16, 4, dtype=torch.bfloat16).step(build(name, 4, 2, 16), [(seq, 8, 1), (seq, 0, 8)])
    assert all(o.dtype == torch.bfloat16 for o in out)


@pytest.mark.parametrize("window", [None, 300])
def test_tiled_matches_reference_on_long_chunk_with_default_tiles(window):
    gen = torch.Generator().manual_seed(8)
    seq = random_seq(900, 8, 2, 64, gen)
    rows = [(seq, 310, 590)]
    outs = [PagedKV(2, 64, 16).step(build(name, 8, 2, 64, window), rows)[0]
            for name in ("reference", "tiled")]
    torch.testing.assert_close(outs[1], outs[0], atol=1e-4, rtol=0)


@pytest.mark.parametrize("kwargs,words", [
    (dict(name="flash"), "unknown attention backend 'flash'"),
    (dict(num_heads=6, num_kv_heads=4), "multiple of num_kv_heads"),
    (dict(sliding_window=0), "sliding_window"),
])
def test_make_backend_rejects_bad_configuration(kwargs, words):
    args = dict(name="reference", num_heads=4, num_kv_heads=2, head_dim=16, scale=0.25, sliding_window=None)
    with pytest.raises(ConfigError, match=words):
        make_backend(**{**args, **kwargs})


def test_decode_rows_out_of_order_are_refused_not_misread():
    gen = torch.Generator().manual_seed(9)
    kv = PagedKV(2, 16, 4)
    rows = [(random_seq(6, 4, 2, 16, gen), 0, 6), (random_seq(9, 4, 2, 16, gen), 8, 1)]
    with pytest.raises(TallyError, match="order decode rows first"):
        kv.step(build("reference", 4, 2, 16), rows, num_decodes=1)  # row 0 is a 6-token prefill


@pytest.mark.parametrize("kv_dtype,sinks", [(torch.int8, None), (torch.float32, torch.tensor([2.0, -1.0, 0.5, 4.0]))],
                         ids=["int8-cache-sdpa", "sinks-eager"])
def test_a_decode_row_off_the_native_kernels_gets_its_bits_alone(kv_dtype, sinks):
    """Torch's attention paths (an int8 cache: SDPA; sinks: the eager composition) give a decode row the bits it gets
    alone, beside rows of other lengths and of its own: rows are never padded to another's length, and SDPA takes
    one row a call (docs/server.md#reproducibility)."""
    gen = torch.Generator().manual_seed(57)
    kv = PagedKV(2, 16, 4, dtype=kv_dtype)
    rows = [(random_seq(ctx, 4, 2, 16, gen), ctx - 1, 1) for ctx in (9, 33, 64, 33, 16, 1)]
    backend = build("reference", 4, 2, 16, sinks=sinks)
    together = kv.step(backend, rows)
    for row, out in zip(rows, together):
        assert torch.equal(kv.step(backend, [row])[0], out)
