"""A prompt's attention: the native causal kernel (tally/native/prefill_attention.h) against the PyTorch paths the
auto backend takes without it (torch's CPU flash SDPA for a whole prompt, the tiled online softmax or a masked SDPA
for a chunk after cached tokens; K/V gathered from the paged cache in both), one layer, fp32 cache, and the native
kernel over an fp16 cache (each tile of 16 keys widened once a call); with --baseline REF instead, the native kernel
against another version's (a git ref), over fp32 and fp16 caches, and whether their bits agree; with --capped,
soft-capped and sink-weighted prompts (one windowed layer of a Gemma 2 2B and a GPT-OSS 20B shape) through the prefill
kernel against the native decode kernel a row at a time, the path they took before the prefill kernel computed
them; then, with --whole, the whole prefill of the built-in model (every layer, projections included) with one and
the other, alternating prompts in one process.

    python benchmarks/prefill_attention.py [--threads 2] [--prompts 128,512,1024,2048] [--chunks 16@3392,64@3392]
        [--rounds 7] [--baseline REF] [--capped 512,2048,4096] [--whole 512,1024]

--chunks: N@C, a chunk of N rows after C cached tokens (chunked prefill beside decodes: few rows, many keys).

Shapes: SmolLM2-135M (9 query heads, 3 KV heads, 64 dims) and Qwen2.5-0.5B (14 query heads, 2 KV heads, 64 dims).
Times are medians of --rounds alternating rounds (3 for --capped's long calls), each ratio the median of the rounds'
own (a shared host's speed moves between minutes).
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

import tally  # noqa: F401  first: it sets OpenMP's waiting policy before torch loads libgomp
import torch
from batch_invariance import baseline_build  # benchmarks/ is on sys.path when a script here runs
from decode_attention import paired, round_us
from workload import corpus_token_ids

from tally import LLM, SamplingParams
from tally.attention import auto
from tally.attention.auto import AutoBackend
from tally.attention.interface import AttentionConfig
from tally.attention.metadata import AttentionMetadata
from tally.native import ops

SHAPES = {"SmolLM2-135M": (9, 3, 64), "Qwen2.5-0.5B": (14, 2, 64)}
# query heads, KV heads, dims, window, soft cap, sinks: Gemma 2 2B's local layers, GPT-OSS 20B's sliding ones
CAPPED_SHAPES = {"Gemma 2 2B, soft cap 50": (8, 4, 256, 4096, 50.0, False),
                 "GPT-OSS 20B, sinks": (64, 8, 64, 128, None, True)}
BLOCK_SIZE = 16
NATIVE_SUPPORTED = auto.native_attention_supported


def torch_path(on: bool) -> None:
    """Route the auto backend's prefills to the PyTorch kernels (on) or back to the native one."""
    auto.native_attention_supported = (lambda *_: False) if on else NATIVE_SUPPORTED


def one_layer(heads: int, kv_heads: int, dim: int, cached: int, new: int, gen: torch.Generator,
              cache_dtype: torch.dtype = torch.float32) -> Callable[[], None]:
    """The auto backend's prefill of `new` tokens after `cached` ones, on a cache holding all of them."""
    backend = AutoBackend(AttentionConfig(heads, kv_heads, dim, dim ** -0.5, None))
    total = cached + new
    blocks = -(-total // BLOCK_SIZE)
    k_cache = torch.randn(blocks, BLOCK_SIZE, kv_heads, dim, generator=gen).to(cache_dtype)
    v_cache = torch.randn_like(k_cache)
    table = torch.randperm(blocks, generator=gen)[None]
    q, out = torch.randn(new, heads, dim, generator=gen), torch.empty(new, heads, dim)
    meta = AttentionMetadata([0, new], [total], table, torch.arange(cached, total), BLOCK_SIZE)
    return lambda: backend._prefill(q, k_cache, v_cache, table[0], total, out, meta)


def cases(prompts: list[int], chunks: list[tuple[int, int]]) -> list[tuple[int, int, str]]:
    """(cached, new, label): whole prompts, a long chunk after a cached prefix, then the short chunks asked for."""
    return ([(0, n, f"{n}") for n in prompts] + [(1536, 512, "512 after 1,536 cached")]
            + [(cached, new, f"{new} after {cached:,} cached") for new, cached in chunks])


def kernels(prompts: list[int], chunks: list[tuple[int, int]], rounds: int) -> None:
    gen = torch.Generator().manual_seed(0)
    print("| model shape | tokens | native ms | PyTorch path ms | PyTorch / native | native, fp16 cache ms | "
          "fp32 / fp16 cache |")
    print("|---|---|---|---|---|---|---|")
    for name, (heads, kv_heads, dim) in SHAPES.items():
        for cached, new, label in cases(prompts, chunks):
            run = one_layer(heads, kv_heads, dim, cached, new, gen)
            run16 = one_layer(heads, kv_heads, dim, cached, new, gen, torch.float16)

            def native() -> None:
                torch_path(False)
                run()

            def pytorch() -> None:
                torch_path(True)
                run()

            def native16() -> None:
                torch_path(False)
                run16()

            r_native, r_torch, r_16 = round_us([native, pytorch, native16],
                                               max(2, 200_000 // (new * (cached + new // 2))), rounds)
            t = statistics.median
            print(f"| {name} | {label} | {t(r_native) / 1e3:.2f} | {t(r_torch) / 1e3:.2f} | "
                  f"{paired(r_torch, r_native):.2f}× | {t(r_16) / 1e3:.2f} | {paired(r_native, r_16):.2f}× |",
                  flush=True)
    torch_path(False)


def against(ref: str, prompts: list[int], chunks: list[tuple[int, int]], rounds: int) -> None:
    """This checkout's prefill kernel against the kernels of another version (`ref`, a git ref), the same calls over
    fp32 and fp16 caches, alternating; whether both give the same bits."""
    other = baseline_build(ref)
    gen = torch.Generator().manual_seed(0)
    print(f"\n| model shape | tokens | cache | native ms | {ref} ms | {ref} / native | same bits |")
    print("|---|---|---|---|---|---|---|")
    for name, (heads, kv_heads, dim) in SHAPES.items():
        for cached, new, label in cases(prompts, chunks):
            for dtype in (torch.float32, torch.float16):
                blocks = -(-(cached + new) // BLOCK_SIZE)
                k_cache = torch.randn(blocks, BLOCK_SIZE, kv_heads, dim, generator=gen).to(dtype)
                v_cache = torch.randn(k_cache.shape, generator=gen).to(dtype)
                table = torch.randperm(blocks, generator=gen)
                q, mine, theirs = (torch.randn(new, heads, dim, generator=gen), torch.empty(new, heads, dim),
                                   torch.empty(new, heads, dim))

                def native() -> None:
                    ops.prefill_attention(q, k_cache, v_cache, table, cached, None, dim ** -0.5, out=mine)

                def baseline() -> None:
                    other.tally_prefill_attention(q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(),
                                                  ops.KV_KINDS[dtype], table.data_ptr(), new, cached, heads,
                                                  kv_heads, dim, BLOCK_SIZE, 0, dim ** -0.5, 0.0, None,
                                                  theirs.data_ptr())

                r_native, r_base = round_us([native, baseline], max(2, 200_000 // (new * (cached + new // 2))),
                                            rounds)
                print(f"| {name} | {label} | {str(dtype).removeprefix('torch.')} | "
                      f"{statistics.median(r_native) / 1e3:.2f} | {statistics.median(r_base) / 1e3:.2f} | "
                      f"{paired(r_base, r_native):.2f}× | {'yes' if torch.equal(mine, theirs) else 'NO'} |",
                      flush=True)


def capped(prompts: list[int]) -> None:
    """One layer's whole-prompt attention, soft-capped or with sinks: the prefill kernel against every row through the
    decode kernel (one call, a row per prompt token, each with its own context length)."""
    gen = torch.Generator().manual_seed(0)
    print("\n| layer shape | tokens | prefill kernel ms | decode kernel, row by row ms | row by row / prefill |")
    print("|---|---|---|---|---|")
    for name, (heads, kv_heads, dim, window, cap, with_sinks) in CAPPED_SHAPES.items():
        sinks = torch.randn(heads, generator=gen) if with_sinks else None
        for n in prompts:
            blocks = -(-n // BLOCK_SIZE)
            k_cache = torch.randn(blocks, BLOCK_SIZE, kv_heads, dim, generator=gen)
            v_cache = torch.randn_like(k_cache)
            table = torch.randperm(blocks, generator=gen)
            q, out = torch.randn(n, heads, dim, generator=gen), torch.empty(n, heads, dim)
            lens, tables = torch.arange(1, n + 1), table[None].expand(n, -1)

            def prefill() -> None:
                ops.prefill_attention(q, k_cache, v_cache, table, 0, window, dim ** -0.5, cap, sinks, out)

            def rows() -> None:
                ops.decode_attention(q, k_cache, v_cache, tables, lens, window, dim ** -0.5, cap, sinks, out)

            r_prefill, r_rows = round_us([prefill, rows], 1, 3)
            print(f"| {name} | {n} | {statistics.median(r_prefill) / 1e3:.1f} | {statistics.median(r_rows) / 1e3:.1f} "
                  f"| {paired(r_rows, r_prefill):.2f}× |", flush=True)


def whole(lengths: list[int], repeats: int) -> None:
    """The built-in model's prefill (max_tokens=1: the prompt and one sampled token), native and PyTorch attention
    alternating, each prompt a new slice of the bundled Shakespeare (prefix caching off)."""
    llm = LLM(None, max_model_len=4096, enable_prefix_caching=False)
    corpus, engine = corpus_token_ids(llm.get_tokenizer()), llm.engine
    rng = random.Random(0)
    params = SamplingParams(temperature=0.0, max_tokens=1)
    print("\n| prompt tokens | native attention ms | PyTorch attention ms | PyTorch / native (median of pairs) |")
    print("|---|---|---|---|")
    for length in lengths:
        times: dict[bool, list[float]] = {False: [], True: []}
        for i in range(repeats * 2 + 2):
            start = rng.randrange(len(corpus) - length)
            ids = corpus[start:start + length]
            use_torch = i % 2 == 1
            torch_path(use_torch)
            began = time.perf_counter()
            engine.add_request(f"{length}-{i}", {"prompt_token_ids": ids}, params)
            while engine.has_unfinished_requests():
                engine.step()
            if i >= 2:  # the first pair warms both paths
                times[use_torch].append(time.perf_counter() - began)
        ratios = [t / n for n, t in zip(times[False], times[True])]
        print(f"| {length} | {1e3 * statistics.median(times[False]):.0f} | {1e3 * statistics.median(times[True]):.0f} "
              f"| {statistics.median(ratios):.2f}× |", flush=True)
    torch_path(False)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompts", default="128,512,1024,2048")
    p.add_argument("--rounds", type=int, default=7, help="alternating rounds; times and ratios their medians")
    p.add_argument("--chunks", default="16@3392,64@3392", help="N@C: N rows after C cached tokens, comma-separated")
    p.add_argument("--capped", default="", help="prompt lengths for soft-capped and sink-weighted layers "
                   "(e.g. 512,2048,4096)")
    p.add_argument("--whole", default="", help="prompt lengths for the whole-prefill A/B (e.g. 512,1024)")
    p.add_argument("--repeats", type=int, default=5, help="--whole: prompts per path and length")
    p.add_argument("--baseline", default=None, help="git ref whose prefill kernel is timed beside this checkout's "
                   "at --prompts (instead of the PyTorch paths)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    chunks = [tuple(int(x) for x in c.split("@")) for c in a.chunks.split(",") if c]
    print(f"{a.threads} threads; one layer's prefill attention, fp32 cache, block size {BLOCK_SIZE}")
    if a.prompts and a.baseline:
        against(a.baseline, [int(n) for n in a.prompts.split(",")], chunks, a.rounds)
    elif a.prompts:
        kernels([int(n) for n in a.prompts.split(",")], chunks, a.rounds)
    if a.capped:
        capped([int(n) for n in a.capped.split(",")])
    if a.whole:
        whole([int(n) for n in a.whole.split(",")], a.repeats)
    print(f"\ncommand: python benchmarks/prefill_attention.py --threads {a.threads} --prompts '{a.prompts}'"
          f" --chunks '{a.chunks}' --rounds {a.rounds}"
          + (f" --capped {a.capped}" if a.capped else "")
          + (f" --whole {a.whole} --repeats {a.repeats}" if a.whole else "")
          + (f" --baseline {a.baseline}" if a.baseline else ""))


if __name__ == "__main__":
    main()
