"""A normal request's latency while an expensive or hostile one runs beside it: each case the hardening bounds (a
template bomb, a nested-loop template, the largest schema the limits admit at n=16 and, for comparison, n=16 without
a schema, a 100,000-string choice, 2,000 prompts x n 8, a 15 MB /tokenize, a prompt built to make the request log's
redaction quadratic) is sent, then a normal chat request right behind it. The table gives the normal request's
median latency beside it over its median alone, and the hostile request's status (goal: every ratio at most 2x,
every status a 4xx or a 200).

    python benchmarks/hostile_latency.py [--model M] [--rounds 3] [--only CASE,...]
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time

import httpx

from tally.engine.grammar_limits import GrammarLimits
from tally.server.process import ServerProcess

NORMAL = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8, "temperature": 0}
HI = [{"role": "user", "content": "hi"}]


def largest_schema_n16(round_: int) -> dict:
    """A schema new to the server's compile cache each round (a client may always send another), so that each
    round compiles it."""
    schema = GrammarLimits().largest_schema(f"round {round_}")
    return {"messages": HI, "n": 16, "max_tokens": 4,
            "response_format": {"type": "json_schema", "json_schema": {"name": "big", "schema": schema}}}


CASES = {  # a body, or a function of the round that gives it
    "template bomb": ("/v1/chat/completions",
                      {"messages": HI, "chat_template": "{% set x = [0] * 50000000 %}{{ x|length }}"}),
    "nested-loop template": ("/v1/chat/completions", {"messages": HI, "chat_template": (
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")}),
    "largest schema at n=16": ("/v1/chat/completions", largest_schema_n16),
    "n=16 without a schema": ("/v1/chat/completions", {"messages": HI, "n": 16, "max_tokens": 4}),
    "100000-string choice": ("/v1/chat/completions",
                              {"messages": HI, "structured_outputs": {"choice": [str(i) for i in range(100_000)]}}),
    "2000 prompts x n 8": ("/v1/completions", {"prompt": [[1, 2, 3]] * 2000, "n": 8, "max_tokens": 2}),
    "15 MB /tokenize": ("/tokenize", {"prompt": "word " * 3_000_000}),
    "redaction-hostile prompt": ("/v1/completions", {"prompt": "a." * 18_000, "max_tokens": 1,
                                                     "truncate_prompt_tokens": 64}),
}


async def timed(client: httpx.AsyncClient, path: str, body: dict) -> tuple[float, int]:
    start = time.perf_counter()
    r = await client.post(path, json=body)
    return time.perf_counter() - start, r.status_code


async def measure(url: str, model: str, rounds: int, only: list[str]) -> tuple[float, dict[str, tuple]]:
    normal = {**NORMAL, "model": model}
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        await timed(client, "/v1/chat/completions", normal)  # warm-up
        alone = [(await timed(client, "/v1/chat/completions", normal))[0] for _ in range(5)]
        out = {}
        for name in only:
            path, body = CASES[name]
            beside, statuses = [], []
            for round_ in range(rounds):
                # alone again before each round: on a shared machine the load drifts over a run of minutes
                alone.append((await timed(client, "/v1/chat/completions", normal))[0])
                hostile = asyncio.create_task(timed(client, path, {"model": model,
                                                                   **(body(round_) if callable(body) else body)}))
                await asyncio.sleep(0.05)  # the hostile request is in flight first
                beside.append((await timed(client, "/v1/chat/completions", normal))[0])
                statuses.append((await hostile)[1])
            out[name] = (statistics.median(beside), sorted(set(statuses)))
    return statistics.median(alone), out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="checkpoint (default: the built-in model)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--only", default=",".join(CASES), help="cases, comma-separated")
    a = p.parse_args()
    only = a.only.split(",")
    flags = ["--max-model-len", "2048", "--trust-request-chat-template", "--log-level", "warning",
             "--request-log", tempfile.mkdtemp(prefix="tally-hostile-log-"), "--log-prompts"]
    if a.model:
        flags = ["--model", a.model, *flags]
    with ServerProcess(flags) as server:
        model = httpx.get(server.url + "/v1/models").json()["data"][0]["id"]
        alone, cases = asyncio.run(measure(server.url, model, a.rounds, only))
    print(f"\na normal chat request (8 tokens) alone: {alone * 1000:.0f} ms (median of 5 at the start and one "
          "before each round)\n")
    print(f"| {'beside':<26} | normal request ms | ratio to alone | hostile status |")
    print(f"|{'-' * 28}|-------------------|----------------|----------------|")
    worst = 0.0
    for name, (beside, statuses) in cases.items():
        worst = max(worst, beside / alone)
        print(f"| {name:<26} | {beside * 1000:17.0f} | {beside / alone:13.2f}x | {', '.join(map(str, statuses)):>14} |")
    print(f"\nworst ratio {worst:.2f}x (goal ≤ 2x)\ncommand: python {' '.join(sys.argv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
