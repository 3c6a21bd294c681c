"""Weights on 2 MB pages against 4 KB pages, in one process (tally/layers/huge_pages.py).

Two LLMs of one model: the first loaded as Tally loads it (weights moved onto huge pages), the second with this
process's transparent huge pages switched off (prctl PR_SET_THP_DISABLE) while it loads, and from then on, so the
kernel's background collapsing cannot give its weights huge pages later either. Each kind of memory's read rate
(plain loads over 400 MB on the kernels' threads, one buffer of each), then batch-1 decode of 128 tokens and a
512-token prefill on each engine, alternating round by round so the machine's drift falls on both; ratios pair by
pair.

    python benchmarks/huge_pages.py [--model PATH] [--rounds 8] [--threads 2]
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

import tally  # noqa: F401  first: it sets OpenMP's waiting policy before torch loads libgomp
import torch

from tally.layers.huge_pages import huge_page_buffer, mapping_fields, thp_setting
from tally.native import ops
from tally.platform import libc_function

PR_SET_THP_DISABLE = 41
READ_BYTES = 400 << 20


def read_gbs(buf: torch.Tensor) -> float:
    return buf.nbytes / ops.read_seconds(buf) / 1e9


def huge_mb(address: int) -> float:
    """MB of the mapping holding `address` that the kernel backs with huge pages."""
    return int(mapping_fields(address).get("AnonHugePages", "0 kB").split()[0]) * 1024 / 1e6


def largest_weight(llm) -> int:
    return max(llm.engine.model.state_dict().values(), key=lambda t: t.nbytes).data_ptr()


def pairs(a: list[float], b: list[float]) -> str:
    r = [y / x for x, y in zip(a, b)]
    return f"{statistics.median(r):.3f} ({min(r):.3f}-{max(r):.3f})"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=None)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    from tally import LLM, SamplingParams

    if thp_setting() not in ("always", "madvise"):
        raise SystemExit(f"transparent huge pages are {thp_setting()} here: nothing to compare")
    kw = dict(max_model_len=1024, kv_cache_memory=128 * 2**20, enable_prefix_caching=False)
    huge = LLM(a.model, **kw)
    huge_buf = huge_page_buffer(READ_BYTES).fill_(1)
    prctl = libc_function("prctl")
    if prctl is None or prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0:
        raise SystemExit("prctl(PR_SET_THP_DISABLE) failed: cannot load a second copy on 4 KB pages")
    small = LLM(a.model, **kw)
    small_buf = torch.ones(READ_BYTES, dtype=torch.uint8)
    print(f"model {small.engine.ledger.model_name}, THP {thp_setting()}, {a.threads} threads; weights "
          f"{huge.engine.model.huge_page_bytes / 1e6:.0f} MB on huge pages after the move; on huge pages (MB, mapping of the largest weight / "
          f"the read buffer): {huge_mb(largest_weight(small)):.0f} / {huge_mb(small_buf.data_ptr()):.0f} in the 4 KB "
          f"copy, {huge_mb(largest_weight(huge)):.0f} / {huge_mb(huge_buf.data_ptr()):.0f} in the other")

    decode = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
    one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    rng = random.Random(0)
    prompt = {"prompt_token_ids": [rng.randrange(100, 20000) for _ in range(512)]}
    tokens = []
    for llm in (small, huge):
        tokens.append(llm.generate("Once upon a time", decode)[0].outputs[0].token_ids)
        llm.generate(prompt, one)
    if tokens[0] != tokens[1]:
        raise SystemExit("the two engines' greedy tokens differ")
    res = {k: ([], []) for k in ("read GB/s", "decode tok/s", "prefill tok/s")}
    for r in range(a.rounds):
        for i in (0, 1) if r % 2 == 0 else (1, 0):
            llm, buf = (small, small_buf) if i == 0 else (huge, huge_buf)
            res["read GB/s"][i].append(read_gbs(buf))
            m = llm.generate("Once upon a time", decode)[0].metrics
            res["decode tok/s"][i].append(127 / (m.last_token_time - m.first_token_time))
            t0 = time.perf_counter()
            llm.generate(prompt, one)
            res["prefill tok/s"][i].append(512 / (time.perf_counter() - t0))
    print(f"{'':<16} {'4 KB pages':>11} {'2 MB pages':>11}  2 MB / 4 KB, median of {a.rounds} pairs (range)")
    for name, (x, y) in res.items():
        print(f"{name:<16} {statistics.median(x):>11.1f} {statistics.median(y):>11.1f}  {pairs(x, y)}")


if __name__ == "__main__":
    main()
