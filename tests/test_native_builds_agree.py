"""The wider builds of the native kernels (tally/native/library.py:builds: AVX-VNNI, AVX-512, AMX) against the AVX2
build, bit for bit, on whichever CPU runs the tests: the same source with other flags, whose passes make the same
integer sums and the same float multiply-adds per lane."""
from __future__ import annotations

import pytest
import torch

from tally.native import library, ops

pytestmark = pytest.mark.skipif(not ops.available(), reason="native kernels unavailable (see tally/native/library.py)")

gen = torch.Generator().manual_seed(0)


def rand(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen)


def test_every_build_gives_decode_attentions_baseline_bits() -> None:
    """Decode attention's AVX-512 passes (two keys' lanes a vector, 16 dims a weighted sum's vector, two query vectors
    a pass) make the 32-byte code's multiply-adds per lane: on whichever CPU runs the tests, each build matches the
    AVX2 build bit for bit, over every cache format, head dims that end inside a 64-dim pass or a 16-lane vector, an
    odd number of query heads a kv head, a verify step's rows of one sequence across a chunk's end beside rows of
    other sequences, windows, soft-capping and sinks."""
    found = library.builds()
    baseline = library.load_build(found.pop("avx2"))
    bs, blocks = 16, 24
    table = torch.randperm(blocks, generator=gen)
    tables = torch.stack([table] * 7 + [table.flip(0), table.roll(5)])
    lens = torch.tensor([250 + i for i in range(7)] + [141, 9])  # 256 ends the second chunk

    def attend(lib, q, kc, vc, scales, window: int, softcap: float, sinks: torch.Tensor | None) -> torch.Tensor:
        n, hq, d = q.shape
        out = torch.empty(n, hq, d)
        args = (tables.data_ptr(), tables.stride(0), lens.data_ptr(), n, hq, kc.shape[2], d, bs, window, 0.125,
                softcap, None if sinks is None else sinks.data_ptr(), out.data_ptr())
        if scales is None:
            lib.tally_decode_attention(q.data_ptr(), q.stride(0), kc.data_ptr(), vc.data_ptr(), ops.KV_KINDS[kc.dtype],
                                       *args)
        else:
            lib.tally_decode_attention_q8(q.data_ptr(), q.stride(0), kc.data_ptr(), vc.data_ptr(),
                                          scales[0].data_ptr(), scales[1].data_ptr(), *args)
        return out

    for hq, hkv, d in ((9, 3, 64), (7, 1, 40), (4, 2, 136)):
        q = rand(9, hq, d)
        kc, vc = rand(blocks, bs, hkv, d), rand(blocks, bs, hkv, d)
        caches = [(kc, vc, None), (kc.half(), vc.half(), None), (kc.bfloat16(), vc.bfloat16(), None),
                  (torch.randint(-127, 128, kc.shape, dtype=torch.int8, generator=gen),
                   torch.randint(-127, 128, vc.shape, dtype=torch.int8, generator=gen),
                   (rand(blocks, bs, hkv).abs() / 64, rand(blocks, bs, hkv).abs() / 64))]
        for k, v, scales in caches:
            for shape in ((0, 0.0, None), (100, 0.5, None), (0, 0.0, rand(hq))):
                want = attend(baseline, q, k, v, scales, *shape)
                for name, flags in found.items():
                    assert torch.equal(want, attend(library.load_build(flags), q, k, v, scales, *shape)), name


def test_every_build_this_cpu_runs_gives_the_baseline_bits() -> None:
    """The wider builds (AVX-VNNI, AVX-512) are the same source with other flags and form the same integer sums: on
    whichever CPU runs the tests, each build it can run matches the AVX2 build bit for bit, over every integer
    format, row counts around the micro-tiles (4 rows and a pass of 3 after them; AVX-512: 8; AMX: 16) and past a
    64-row pass, a group of 16, and an odd number of tiles whose last is partial (AVX-512 pairs tiles); and prefill
    attention, whose AVX-512 passes make the same multiply-adds per lane."""
    n, k = 68, 512  # two K-quant super-blocks: an activation block folds mid-row
    q4 = ops.pack_q4(torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=gen))
    # d, m and Q6_K's d as a base per 256 weights times int8 steps, with few enough mantissa bits that fp16 holds
    # the products too: the same floats in all three of the kernels' forms (int_dots.h: GroupValues)
    factors = [(torch.randint(1, 32, (n, k // 256), generator=gen) / 256.0 * sign,
                torch.randint(-63, 64, (n, k // 256 * groups), generator=gen))
               for sign, groups in ((1, 8), (-1, 8), (1, 16))]
    q5, qh5 = ops.pack_planes(torch.randint(0, 32, (n, k), dtype=torch.uint8, generator=gen), 5)
    q6, qh6 = ops.pack_planes(torch.randint(0, 64, (n, k), dtype=torch.uint8, generator=gen), 6)
    q8 = ops.pack_q8(torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen))
    forms = [[ops.pack_tile_scales(b.repeat_interleave(s.shape[1] // b.shape[1], 1) * s.float(), half)
              for b, s in factors] for half in (False, True)]
    forms.append([ops.pack_tile_factors(b, s) for b, s in factors])

    def run(lib, x: torch.Tensor) -> list[torch.Tensor]:
        outs = []
        for d, m, d16 in forms:
            for qs, qh, scales, mins, group, bits in ((q4, None, d, m, 32, 4), (q4, None, d, None, 32, 4),
                                                      (q5, qh5, d, None, 32, 5), (q6, qh6, d16, None, 16, 6)):
                y = torch.empty(x.shape[0], n)
                lib.tally_gemm_q4(x.data_ptr(), qs.data_ptr(), None if qh is None else qh.data_ptr(),
                                  scales.data_ptr(), None if mins is None else mins.data_ptr(), None, y.data_ptr(),
                                  x.shape[0], n, k, group, bits, 0, ops.scale_form(scales, mins))
                outs.append(y)
            y = torch.empty(x.shape[0], n)
            lib.tally_gemm_q8(x.data_ptr(), q8.data_ptr(), d.data_ptr(), None, y.data_ptr(), x.shape[0], n, k, 32, 0,
                              0, ops.scale_form(d), 1)  # symmetric: AVX2's one-row loop (int8_one_row_dots)
            outs.append(y)
        # fp32 and fp16 values, the same floats: the same bits. The factored form (a K-quant's) meets activations
        # rounded per 256 values (int_tiles.h: activation_block), so its own, checked across builds below.
        assert all(map(torch.equal, outs[:5], outs[5:10]))
        return outs

    found = library.builds()
    baseline = library.load_build(found.pop("avx2"))
    for hq, hkv, dim in ((9, 3, 64), (7, 1, 40)):  # prefill attention: 40 dims end inside a 64-dim pass
        kc, vc = rand(8, 16, hkv, dim), rand(8, 16, hkv, dim)
        q, table = rand(70, hq, dim), torch.randperm(8, generator=gen)

        sinks = rand(hq)

        def attend(lib, window: int, softcap: float, sinks: torch.Tensor | None) -> torch.Tensor:
            out = torch.empty(70, hq, dim)
            lib.tally_prefill_attention(q.data_ptr(), q.stride(0), kc.data_ptr(), vc.data_ptr(),
                                        ops.KV_KINDS[torch.float32], table.data_ptr(), 70, 30, hq, hkv, dim, 16,
                                        window, 0.125, softcap, None if sinks is None else sinks.data_ptr(),
                                        out.data_ptr())
            return out

        for shape in ((0, 0.0, None), (20, 0.5, None), (20, 0.0, sinks)):  # plain, soft-capped, sinks; windowed
            want = attend(baseline, *shape)
            for name, flags in found.items():
                assert torch.equal(want, attend(library.load_build(flags), *shape)), name
    for rows in (1, 3, 5, 6, 7, 8, 9, 20, 70):
        x = rand(rows, k)
        want = run(baseline, x)
        for name, flags in found.items():
            for w, g in zip(want, run(library.load_build(flags), x)):
                assert torch.equal(w, g), name
