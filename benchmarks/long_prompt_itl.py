"""Do running streams keep flowing while a long prompt is prefilled? `tally serve` on the built-in model, N streams
decoding, then one ~3,500-token prompt arrives; each stream's gaps between chunks are recorded. Arms, their servers
up side by side and run in turn (the order reversed each round): no latency target (off, --max-itl 1e9: the prompt's
prefill shares each step with the decodes in chunks of up to --max-num-batched-tokens), the default (--max-itl
0.3), or any other --max-itl value in seconds.

    python benchmarks/long_prompt_itl.py [--streams 6,16,32] [--prompt-tokens 3500] [--arms off,default,0.6]
        [--rounds 2]

Prints per arm and stream count: the streams' usual gap (median before the long prompt), the P99 and longest gap
while it was prefilled, how many streams missed the goal (longest gap < max(4 x usual, 300 ms)), how many gaps
skipped a step (two or more chunks reached the other streams meanwhile: a gap from delivery, not from the step),
and the long prompt's TTFT; each round's figures, then the medians and the TTFT ratio against the first arm.
"""
from __future__ import annotations

import argparse
import asyncio
import bisect
import statistics
import time
from contextlib import ExitStack
from dataclasses import dataclass, field

import httpx

from tally.server.process import ServerProcess
from tally.traces import DATA_DIR

# KV room for 32 streams that each grow by the long prompt's steps, beside the long prompt itself
SERVER_FLAGS = ["--max-model-len", "4096", "--kv-cache-memory", "1GiB", "--log-level", "warning"]
ARMS = {"off": ["--max-itl", "1e9"], "default": []}
GOAL_FLOOR_S, GOAL_TIMES_USUAL = 0.3, 4.0


def arm_flags(arm: str) -> list[str]:
    """An arm's flags: off, default, or a --max-itl value in seconds."""
    return ARMS[arm] if arm in ARMS else ["--max-itl", arm]


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
    async with httpx.AsyncClient(base_url=server.url, timeout=900,
                                 limits=httpx.Limits(max_connections=n_streams + 4)) as client:
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
    return judge(streams, arrived, first_token)


def judge(streams: list[Stream], arrived: float, first_token: float) -> dict:
    usual, missed, skipped, during_all, longest_all = [], 0, 0, [], []
    for s in streams:
        before = [b - a for a, b in zip(s.chunk_s, s.chunk_s[1:]) if b < arrived]
        gaps = [(a, b) for a, b in zip(s.chunk_s, s.chunk_s[1:]) if b > arrived and a < first_token]
        # A gap still open when the long prompt's answer came counts up to that moment.
        gaps.append((max([c for c in s.chunk_s if c < first_token], default=arrived), first_token))
        others = sorted(c for o in streams if o is not s for c in o.chunk_s)
        # Another stream's chunks inside this gap, beyond one per other stream, are steps this stream sat out.
        skipped += sum(_inside(others, a, b) >= 2 * (len(streams) - 1) for a, b in gaps if len(streams) > 1)
        usual.append(statistics.median(before))
        longest = max(b - a for a, b in gaps)
        longest_all.append(longest)
        missed += longest > max(GOAL_TIMES_USUAL * usual[-1], GOAL_FLOOR_S)
        during_all += [b - a for a, b in gaps]
    p99 = sorted(during_all)[min(len(during_all) - 1, int(0.99 * len(during_all)))]
    return {"usual_s": statistics.median(usual), "longest_s": max(longest_all), "p99_s": p99, "missed": missed,
            "skipped": skipped, "ttft_s": first_token - arrived}


def _inside(sorted_times: list[float], a: float, b: float) -> int:
    return bisect.bisect_left(sorted_times, b) - bisect.bisect_right(sorted_times, a)


def long_prompt(server: ServerProcess, tokens: int, round_index: int) -> list[int]:
    """A different stretch of the play each round: a prompt seen before would be read from the prefix cache."""
    text = (DATA_DIR / "shakespeare.txt").read_text()
    start = 40_000 * (round_index % (len(text) // 40_000))
    ids = httpx.post(server.url + "/tokenize", json={"prompt": text[start:start + 40_000]}).json()["tokens"]
    assert len(ids) >= tokens, f"the play's stretch holds {len(ids)} tokens, fewer than --prompt-tokens {tokens}"
    return ids[:tokens]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", default="6", help="stream counts, comma-separated")
    p.add_argument("--prompt-tokens", type=int, default=3500)
    p.add_argument("--arms", default="off,default")
    p.add_argument("--rounds", type=int, default=1, help="each arm this many times per stream count, alternating")
    a = p.parse_args()
    arms = a.arms.split(",")
    counts = [int(n) for n in a.streams.split(",")]
    results: dict[tuple[str, int], list[dict]] = {}
    with ExitStack() as stack:
        servers = {arm: stack.enter_context(ServerProcess([*SERVER_FLAGS, *arm_flags(arm)])) for arm in arms}
        for r in range(a.rounds):
            for n in counts:
                for arm in (arms if r % 2 == 0 else arms[::-1]):
                    ids = long_prompt(servers[arm], a.prompt_tokens, r * len(counts) + counts.index(n))
                    res = asyncio.run(run_arm(servers[arm], ids, n))
                    results.setdefault((arm, n), []).append(res)
                    print(f"round {r + 1} {arm:<8} {n:>3} streams: {_row(res)}", flush=True)
    print(f"\nN streams decoding, one {a.prompt_tokens}-token prompt arrives (built-in model); medians of "
          f"{a.rounds} round(s)")
    print(f"{'arm':<9} {'streams':>7} {'usual':>6} {'ITL P99':>8} {'longest':>8} {'longest/usual':>13} "
          f"{'missed goal':>11} {'skipped a step':>14} {'TTFT':>7} {'TTFT ratio':>10}")
    for n in counts:
        base = statistics.median(r["ttft_s"] for r in results[(arms[0], n)])
        for arm in arms:
            rs = results[(arm, n)]
            med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            print(f"{arm:<9} {n:>7} {med['usual_s'] * 1e3:>4.0f}ms {med['p99_s'] * 1e3:>6.0f}ms "
                  f"{med['longest_s'] * 1e3:>6.0f}ms {med['longest_s'] / med['usual_s']:>12.1f}x "
                  f"{med['missed']:>6.0f} of {n:<2} {med['skipped']:>14.0f} {med['ttft_s']:>6.1f}s "
                  f"{med['ttft_s'] / base:>9.2f}x")
    print("\ncommand: python benchmarks/long_prompt_itl.py " + " ".join(f"--{k.replace('_', '-')} {v}"
                                                              for k, v in vars(a).items()))


def _row(r: dict) -> str:
    return (f"usual {r['usual_s'] * 1e3:.0f} ms, P99 {r['p99_s'] * 1e3:.0f} ms, longest {r['longest_s'] * 1e3:.0f} ms, "
            f"missed {r['missed']}, skipped {r['skipped']}, TTFT {r['ttft_s']:.1f} s")


if __name__ == "__main__":
    main()
