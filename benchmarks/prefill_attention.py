"""A prompt's attention: the native causal kernel (tally/native/prefill_attention.h) against the PyTorch paths the
auto backend takes without it (torch's CPU flash SDPA for a whole prompt, the tiled online softmax or a masked SDPA
for a chunk after cached tokens; K/V gathered from the paged cache in both), one layer, fp32 cache, and the native
kernel over an fp16 cache (each tile of 16 keys widened as an item reads it); then, with --whole, the whole prefill of
the built-in model (every layer, projections included) with one and the other, alternating prompts in one process.

    python benchmarks/prefill_attention.py [--threads 2] [--prompts 128,512,1024,2048] [--whole 512,1024]

Shapes: SmolLM2-135M (9 query heads, 3 KV heads, 64 dims) and Qwen2.5-0.5B (14 query heads, 2 KV heads, 64 dims).
Best of 7 alternating rounds per case (a VM's speed drifts between runs).
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

import tally  # noqa: F401  first: it sets OpenMP's waiting policy before torch loads libgomp
import torch
from decode_attention import best_us  # benchmarks/ is on sys.path when a script here runs
from workload import corpus_token_ids

from tally import LLM, SamplingParams
from tally.attention import auto
from tally.attention.auto import AutoBackend
from tally.attention.interface import AttentionConfig
from tally.attention.metadata import AttentionMetadata

SHAPES = {"SmolLM2-135M": (9, 3, 64), "Qwen2.5-0.5B": (14, 2, 64)}
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


def kernels(prompts: list[int]) -> None:
    gen = torch.Generator().manual_seed(0)
    print("| model shape | tokens | native ms | PyTorch path ms | PyTorch / native | native, fp16 cache ms | "
          "fp32 / fp16 cache |")
    print("|---|---|---|---|---|---|---|")
    for name, (heads, kv_heads, dim) in SHAPES.items():
        cases = [(0, n, f"{n}") for n in prompts] + [(1536, 512, "512 after 1,536 cached")]
        for cached, new, label in cases:
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

            t_native, t_torch, t_16 = (t / 1e3 for t in best_us(
                [native, pytorch, native16], calls=max(2, 200_000 // (new * (cached + new // 2)))))
            print(f"| {name} | {label} | {t_native:.2f} | {t_torch:.2f} | {t_torch / t_native:.2f}× | {t_16:.2f} | "
                  f"{t_native / t_16:.2f}× |", flush=True)
    torch_path(False)


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
    p.add_argument("--whole", default="", help="prompt lengths for the whole-prefill A/B (e.g. 512,1024)")
    p.add_argument("--repeats", type=int, default=5, help="--whole: prompts per path and length")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    print(f"{a.threads} threads; one layer's prefill attention, fp32 cache, block size {BLOCK_SIZE}")
    kernels([int(n) for n in a.prompts.split(",")])
    if a.whole:
        whole([int(n) for n in a.whole.split(",")], a.repeats)
    print(f"\ncommand: python benchmarks/prefill_attention.py --threads {a.threads} --prompts {a.prompts}"
          + (f" --whole {a.whole} --repeats {a.repeats}" if a.whole else ""))


if __name__ == "__main__":
    main()
