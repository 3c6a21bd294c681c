"""Do running streams keep flowing while a long prompt is prefilled? `tally serve` on the built-in model, 6 streams
decoding, then one ~3,500-token prompt arrives; each stream's gaps between chunks are recorded. Two arms, same
run: no latency target (--max-itl 1e9: the prompt's prefill shares each step with the decodes in chunks of up to
--max-num-batched-tokens) and the server's default target.

    python benchmarks/long_prompt_itl.py [--streams 6] [--prompt-tokens 3500] [--arms off,default]

Prints per arm: the streams' usual gap (median before the long prompt), their longest gap while it was
prefilled, the ratio, and the long prompt's TTFT. The goal: longest gap < max(4 x usual, 300 ms).
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from dataclasses import dataclass, field

import httpx

from tally.server.process import ServerProcess
from tally.traces import DATA_DIR

SERVER_FLAGS = ["--max-model-len", "4096", "--kv-cache-memory", "512MiB", "--log-level", "warning"]
ARMS = {"off": ["--max-itl", "1e9"], "default": []}


@dataclass
class Stream:
    chunk_s: list[float] = field(default_factory=list)


async def stream(client: httpx.AsyncClient, body: dict, out: Stream, stop: asyncio.Event) -> None:
    async with client.stream("POST", "/v1/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.chunk_s.append(time.perf_counter())
            if stop.is_set():
                return


async def run_arm(server: ServerProcess, prompt_ids: list[int], n_streams: int) -> dict:
    async with httpx.AsyncClient(base_url=server.url, timeout=600) as client:
        stop = asyncio.Event()
        streams = [Stream() for _ in range(n_streams)]
        tasks = [asyncio.create_task(stream(client, {
            "model": "smollm2-135m", "prompt": f"Story {i}: once upon a time", "max_tokens": 3000,
            "ignore_eos": True, "stream": True}, s, stop)) for i, s in enumerate(streams)]
        while min(len(s.chunk_s) for s in streams) < 20:  # every stream decoding at its usual pace
            await asyncio.sleep(0.05)
        arrived = time.perf_counter()
        long = await client.post("/v1/completions", json={"model": "smollm2-135m", "prompt": prompt_ids,
                                                          "max_tokens": 1, "stream": False})
        first_token = time.perf_counter()
        assert long.status_code == 200, long.text
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    usual, longest, during_all = [], [], []
    for s in streams:
        before = [b - a for a, b in zip(s.chunk_s, s.chunk_s[1:]) if b < arrived]
        during = [b - a for a, b in zip(s.chunk_s, s.chunk_s[1:]) if b > arrived and a < first_token]
        # A gap still open when the long prompt's answer came counts up to that moment.
        tail = first_token - max([c for c in s.chunk_s if c < first_token], default=arrived)
        usual.append(statistics.median(before))
        longest.append(max(during + [tail]))
        during_all += during + [tail]
    p99 = sorted(during_all)[min(len(during_all) - 1, int(0.99 * len(during_all)))]
    return {"usual_s": statistics.median(usual), "longest_s": max(longest), "p99_s": p99,
            "ttft_s": first_token - arrived}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=6)
    p.add_argument("--prompt-tokens", type=int, default=3500)
    p.add_argument("--arms", default="off,default")
    a = p.parse_args()
    rows = []
    for arm in a.arms.split(","):
        with ServerProcess([*SERVER_FLAGS, *ARMS[arm]]) as server:
            text = (DATA_DIR / "shakespeare.txt").read_text()[:40_000]
            ids = httpx.post(server.url + "/tokenize", json={"prompt": text}).json()["tokens"][:a.prompt_tokens]
            rows.append((arm, asyncio.run(run_arm(server, ids, a.streams))))
    print(f"\n{a.streams} streams decoding, one {a.prompt_tokens}-token prompt arrives (built-in model)")
    print(f"{'arm':<10} {'usual gap':>10} {'ITL P99':>9} {'longest gap':>12} {'longest/usual':>14} "
          f"{'long prompt TTFT':>17}")
    for arm, r in rows:
        print(f"{arm:<10} {r['usual_s'] * 1e3:>8.0f}ms {r['p99_s'] * 1e3:>7.0f}ms {r['longest_s'] * 1e3:>10.0f}ms "
              f"{r['longest_s'] / r['usual_s']:>13.1f}x {r['ttft_s']:>16.2f}s")
    print("\ncommand: python benchmarks/long_prompt_itl.py " + " ".join(f"--{k.replace('_', '-')} {v}"
                                                              for k, v in vars(a).items()))


if __name__ == "__main__":
    main()
