"""The native paged decode attention against PyTorch's SDPA over the same keys gathered, one layer of SmolLM2-135M's
shape (9 query heads, 3 KV heads, 64 dims): one row, a speculative verify step's 5 rows of one sequence (each key
read once for all of them), and 16 rows of 16 sequences, at several contexts. Times are medians of --rounds
alternating rounds and each ratio the median of the rounds' own; the SDPA peer gets its fp32 keys already gathered
(its gather is not timed), so its figure flatters it. The native kernel runs over an fp32 cache and over each of
--kv-dtypes (the same values rounded: fp16 / bf16 caches are read in place and widened as they load), with the fp32
cache's time over theirs. --layers N gives each of N layers caches of its own, called in turn, so the keys come from
memory as in a decode step (one layer's fit in the last-level cache); times are then per layer. --build NAME times
that build of the kernels (tally/native/library.py:builds, e.g. avx2) beside the one this CPU loads, over the fp32
cache and each of --kv-dtypes: its time over the loaded one's; --baseline REF the same for the kernels of another
version (a git ref, e.g. the commit before a change).

    python benchmarks/decode_attention.py [--threads 2] [--contexts 128,600,1200,2400] [--layers 1] [--rounds 15]
                                     [--kv-dtypes float16,bfloat16] [--build avx2 | --baseline REF]
"""
from __future__ import annotations

import argparse
import statistics
import time

import tally  # noqa: F401  first: it sets OpenMP's waiting policy before torch loads libgomp
import torch
import torch.nn.functional as F
from batch_invariance import baseline_build  # benchmarks/ is on sys.path when a script here runs

from tally.native import library, ops

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 9, 3, 64, 16
SCALE = HEAD_DIM ** -0.5


def case(context: int, rows: int, one_sequence: bool, gen: torch.Generator):
    """Caches, tables, lengths and queries; `one_sequence`: rows are positions context.. of one sequence."""
    per_seq = -(-(context + rows) // BLOCK_SIZE)
    num_blocks = per_seq * (1 if one_sequence else rows)
    k_cache = torch.randn(num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM, generator=gen)
    v_cache = torch.randn_like(k_cache)
    order = torch.randperm(num_blocks, generator=gen)
    if one_sequence:
        tables = order[None].repeat(rows, 1)
        lens = torch.arange(context, context + rows)
    else:
        tables = order.view(rows, per_seq)
        lens = torch.full((rows,), context)
    return k_cache, v_cache, tables.contiguous(), lens, torch.randn(rows, HEADS, HEAD_DIM, generator=gen)


def gathered(k_cache, v_cache, tables, lens):
    """Per row: K and V [1, Hkv, L, D] of its keys, for SDPA."""
    out = []
    for table, n in zip(tables, lens.tolist()):
        pos = torch.arange(n)
        slots = table[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE
        k = k_cache.view(-1, KV_HEADS, HEAD_DIM)[slots].transpose(0, 1)[None].contiguous()
        v = v_cache.view(-1, KV_HEADS, HEAD_DIM)[slots].transpose(0, 1)[None].contiguous()
        out.append((k, v))
    return out


def attend(lib, q, k_cache, v_cache, tables, lens) -> None:
    """ops.decode_attention through the build `lib`"""
    out = torch.empty_like(q)
    lib.tally_decode_attention(q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(),
                               ops.KV_KINDS[k_cache.dtype], tables.data_ptr(), tables.stride(0), lens.data_ptr(),
                               q.shape[0], HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, 0, SCALE, 0.0, None, out.data_ptr())


def round_us(fns, calls: int, rounds: int) -> list[list[float]]:
    """Per function, its µs a call in each of `rounds` rounds, the functions alternating within a round."""
    times = [[] for _ in fns]
    for f in fns:
        f()
    for _ in range(rounds):
        for i, f in enumerate(fns):
            start = time.perf_counter()
            for _ in range(calls):
                f()
            times[i].append((time.perf_counter() - start) / calls * 1e6)
    return times


def paired(over: list[float], under: list[float]) -> float:
    """The median over rounds of one round's over / under: a shared host's speed, which moves between minutes, moves
    both sides of a round alike (a ratio of two bests would compare one side's lucky minute with the other's)."""
    return statistics.median(o / u for o, u in zip(over, under))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--contexts", default="128,600,1200,2400")
    p.add_argument("--layers", type=int, default=1, help="layers with caches of their own, called in turn")
    p.add_argument("--rounds", type=int, default=15, help="alternating rounds; times and ratios their medians")
    p.add_argument("--kv-dtypes", default="float16,bfloat16", help="16-bit caches timed beside fp32 ('' for none)")
    p.add_argument("--build", default=None, help="a build of the kernels timed beside the loaded one")
    p.add_argument("--baseline", default=None, help="git ref whose kernels (the build this CPU loads) are timed "
                                                    "beside this checkout's")
    a = p.parse_args()
    found = library.builds()
    if a.build and a.build not in found:
        p.error(f"--build {a.build}: this CPU runs the builds {', '.join(found)}")
    if a.build and a.baseline:
        p.error("--build and --baseline each name the kernels timed beside the loaded ones: give one")
    other = library.load_build(found[a.build]) if a.build else a.baseline and baseline_build(a.baseline)
    label = a.build or a.baseline
    dtypes = [getattr(torch, name) for name in a.kv_dtypes.split(",") if name]
    torch.set_num_threads(a.threads)
    gen = torch.Generator().manual_seed(0)
    print(f"{a.threads} threads; {a.layers} layer(s), {HEADS} query / {KV_HEADS} KV heads x {HEAD_DIM}; µs per layer")
    names = [str(d).removeprefix("torch.") for d in dtypes]
    caches = ["fp32", *names] if other else []
    print("| context | rows | native µs | SDPA over gathered keys µs | SDPA / native |"
          + "".join(f" native {n} µs | fp32 / {n} |" for n in names)
          + "".join(f" {label} {n} µs | {label} / loaded |" for n in caches))
    print("|---|---|---|---|---|" + "---|---|" * (len(names) + len(caches)))
    for context in (int(c) for c in a.contexts.split(",")):
        for rows, one_sequence, label in ((1, True, "1"), (5, True, "5 of one sequence"), (16, False, "16 sequences")):
            layers = [case(context, rows, one_sequence, gen) for _ in range(a.layers)]
            kvs = [gathered(k_cache, v_cache, tables, lens) for k_cache, v_cache, tables, lens, _ in layers]

            def native(layers=layers):
                for k_cache, v_cache, tables, lens, q in layers:
                    ops.decode_attention(q, k_cache, v_cache, tables, lens, None, SCALE)

            narrow = [[(k.to(d), v.to(d), *rest) for k, v, *rest in layers] for d in dtypes]
            narrow_fns = [lambda layers=cast: native(layers) for cast in narrow]
            other_fns = [lambda layers=cast: [attend(other, q, *rest) for *rest, q in layers]
                         for cast in [layers, *narrow]] if other else []

            def sdpa():
                for (*_, q), kv in zip(layers, kvs):
                    for r, (k, v) in enumerate(kv):
                        F.scaled_dot_product_attention(q[r][None, :, None], k, v, scale=SCALE, enable_gqa=True)

            calls = max(3, 6000 // (context * rows * a.layers) + 3)
            rounds = [[t / a.layers for t in ts]
                      for ts in round_us([native, sdpa, *narrow_fns, *other_fns], calls, a.rounds)]
            r_native, r_sdpa, r_narrow, r_other = (rounds[0], rounds[1], rounds[2:2 + len(names)],
                                                   rounds[2 + len(names):])
            t = statistics.median
            print(f"| {context} | {label} | {t(r_native):,.1f} | {t(r_sdpa):,.1f} | {paired(r_sdpa, r_native):.2f}× |"
                  + "".join(f" {t(r):,.1f} | {paired(r_native, r):.2f}× |" for r in r_narrow)
                  + "".join(f" {t(r):,.1f} | {paired(r, mine):.2f}× |" for r, mine in zip(r_other, [r_native, *r_narrow])),
                  flush=True)
    print(f"\ncommand: python benchmarks/decode_attention.py --threads {a.threads} --contexts {a.contexts} "
          f"--layers {a.layers} --rounds {a.rounds} --kv-dtypes '{a.kv_dtypes}'" + (f" --build {a.build}" if a.build else "")
          + (f" --baseline {a.baseline}" if a.baseline else ""))


if __name__ == "__main__":
    main()
