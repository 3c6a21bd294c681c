"""The reliability figure: `tally serve` at about twice its measured capacity for a long run,
with the conversation trace's lengths (divided by --scale) in bursts, shared prompt prefixes, 5% of clients
leaving mid-stream and 1% bad requests of every kind the server must refuse. Nothing may be lost or hang, the KV
pool must be whole again afterwards, no request may meet a 5xx it did not earn, and memory and fragmentation must
not trend (`tally bench --soak`'s verdict).

    python benchmarks/soak_hostile.py --duration 60m [--model PATH] [--scale 16] [--out DIR]

Steps: start the server; measure its capacity (a closed loop at --max-num-seqs clients); run `tally bench --soak`
at twice that rate beside this script's own leaving clients and bad requests; wait for the pool to empty; read
the server's counters and log. Prints one table and writes DIR/soak.json; exit status 1 if any check failed.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from serve_demos import scaled_trace  # benchmarks/ is on sys.path when a script here runs

from tally.server.process import ServerProcess
from tally.units import parse_duration_s

SLOTS = 8
HI = {"messages": [{"role": "user", "content": "hi"}]}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
DEEP = "[" * 150_000 + "]" * 150_000  # JSON text nested far past any bound, inside a string field
# Bad requests, one of each kind the server must refuse with a 4xx (docs/server.md, "What one request may ask for").
BAD = [
    ("/v1/completions", {"prompt": "a", "stop": "x" * 2**20}),
    ("/v1/completions", {"prompt": "a", "n": 1000}),
    ("/v1/completions", {"prompt": "a", "seed": 2**70}),
    ("/v1/completions", '{"prompt": "a\\ud800"}'),
    ("/v1/completions", '{"prompt": "a", "temperature": Infinity}'),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": None}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 99}),
    ("/v1/completions", '{"prompt": ' + "[" * 10_000 + "]" * 10_000 + "}"),
    ("/v1/completions", {"prompt": "a", "max_tokens": 10**9}),
    ("/tokenize", '{"prompt": "\\udc00"}'),
    ("/v1/completions", "{not json"),
    # templates, grammars, fan-out and tool fields: each refused before it can stall the loop or the engine thread
    ("/v1/chat/completions", {**HI, "chat_template": "{% set x = [0] * 50000000 %}{{ x|length }}"}),
    ("/v1/chat/completions", {**HI, "chat_template": "{% for i in range(100000) %}{% for j in range(100000) %}"
                                                      "{% endfor %}{% endfor %}"}),
    ("/v1/chat/completions", {**HI, "structured_outputs": {"choice": [str(i) for i in range(100_000)]}}),
    ("/v1/completions", {"prompt": [[1, 2, 3]] * 2000, "n": 8, "max_tokens": 2}),
    ("/v1/chat/completions", {**HI, "tools": [TOOL], "tool_choice": {"type": "function", "function": "f"}}),
    ("/v1/chat/completions", {"messages": [HI["messages"][0], {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": DEEP}}]}]}),
    ("/v1/chat/completions", {**HI, "guided_json": DEEP}),
    ("/v1/chat/completions", {**HI, "min_tokens": 5000}),
    ("/v1/chat/completions", {**HI, "model": "m" * 100_000}),
]
LOST = ("timeout", "incomplete_stream", "no_output")  # a request that ended without an answer


@dataclass
class Chaos:
    left: int = 0  # streams this script left after their first chunk
    left_failed: list[str] = field(default_factory=list)
    bad_status: dict[str, int] = field(default_factory=dict)  # status -> count
    bad_unanswered: int = 0


async def leave_mid_stream(client: httpx.AsyncClient, model: str, chaos: Chaos) -> None:
    body = {"model": model, "prompt": "Tell me a long story about the sea.", "max_tokens": 200, "stream": True}
    try:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                if r.status_code == 429 and r.headers.get("retry-after"):
                    return  # turned away fairly
                chaos.left_failed.append(f"http_{r.status_code}")
                return
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    chaos.left += 1
                    return  # leaving closes the connection: the server must abort and free the request
    except httpx.HTTPError as exc:
        chaos.left_failed.append(type(exc).__name__)


async def send_bad(client: httpx.AsyncClient, model: str, path: str, body: dict | str, chaos: Chaos) -> None:
    content = json.dumps({"model": model, **body}) if isinstance(body, dict) else body
    try:
        r = await client.post(path, content=content, headers={"content-type": "application/json"})
        chaos.bad_status[str(r.status_code)] = chaos.bad_status.get(str(r.status_code), 0) + 1
    except httpx.HTTPError:
        chaos.bad_unanswered += 1


async def chaos_loop(url: str, model: str, rate_per_s: float, duration_s: float, chaos: Chaos) -> None:
    """Poisson arrivals of leaving clients (5% of the load's rate) and bad requests (1%) for duration_s."""
    rng, tasks = random.Random(1), []
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        start = time.monotonic()
        kinds = [("leave", 0.05 * rate_per_s), ("bad", 0.01 * rate_per_s)]
        total = sum(r for _, r in kinds)
        i = 0
        while time.monotonic() - start < duration_s:
            await asyncio.sleep(rng.expovariate(total))
            if rng.random() < kinds[0][1] / total:
                tasks.append(asyncio.create_task(leave_mid_stream(client, model, chaos)))
            else:
                path, body = BAD[i % len(BAD)]
                i += 1
                tasks.append(asyncio.create_task(send_bad(client, model, path, body, chaos)))
        await asyncio.gather(*tasks)


def bench(url: str, out: Path, *args: str) -> dict:
    """A `tally bench` run whose whole result (every request, the soak samples) stays in `out` for diagnosis."""
    subprocess.run([sys.executable, "-m", "tally.cli", "bench", "--url", url, "--quiet", "--out", str(out), *args],
                   check=False)
    return json.loads(out.read_text())


def metrics(url: str) -> dict[tuple[str, str], float]:
    text = httpx.get(url + "/metrics").text
    return {(s.name, json.dumps(s.labels, sort_keys=True)): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _listed(counts: dict) -> str:
    """{'ok': 3, 'failed': 1} -> 'ok 3, failed 1', for a reader rather than Python."""
    return ", ".join(f"{key} {value}" for key, value in counts.items())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=parse_duration_s, default=parse_duration_s("60m"))
    p.add_argument("--model", default=None, help="checkpoint (default: the built-in model)")
    p.add_argument("--scale", type=int, default=16, help="divide the trace's lengths by this")
    p.add_argument("--capacity-requests", type=int, default=40)
    p.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "tally_soak")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    trace, _, _ = scaled_trace(a.out / "lengths.csv", a.scale)
    flags = ["--max-model-len", "2048", "--kv-cache-memory", "256MiB", "--max-num-seqs", str(SLOTS),
             "--max-queue", str(4 * SLOTS), "--log-level", "warning",
             "--trust-request-chat-template"]  # so that the hostile templates reach the sandbox
    if a.model:
        flags = ["--model", a.model, "--served-model-name", "soak", *flags]
    with ServerProcess(flags) as server:
        model = httpx.get(server.url + "/v1/models").json()["data"][0]["id"]
        common = ["--model", model, "--lengths", f"trace:{trace}", "--timeout", "600"]
        capacity = bench(server.url, a.out / "capacity.json", *common, "--concurrency", str(SLOTS),
                         "--requests", str(a.capacity_requests))
        capacity_rps = capacity["summary"]["throughput"]["requests_per_s"]
        rate = 2 * capacity_rps
        chaos = Chaos()
        chaos_thread = threading.Thread(target=lambda: asyncio.run(
            chaos_loop(server.url, model, rate, a.duration, chaos)))
        chaos_thread.start()
        sample_s = max(a.duration / 30, 2.0)
        # The server's memory rises to a high-water mark over its first minutes under load (allocator arenas,
        # buffers sized by the longest inputs seen), then stays flat; the trend is judged after it, as a soak's
        # warmup.
        warmup_s = min(a.duration / 6, 300.0)
        run = bench(server.url, a.out / "load.json", *common, "--rate", f"{rate:.3f}", "--burstiness", "0.5",
                    "--prefix-share", "0.3", "--system-prompt-tokens", "64", "--soak", f"{a.duration}s",
                    "--sample", f"{sample_s}s", "--warmup", f"{warmup_s}s", "--server-pid", str(server.proc.pid))
        chaos_thread.join()
        deadline, led = time.monotonic() + 300, {}
        while time.monotonic() < deadline:
            led = httpx.get(server.url + "/ledger").json()
            if led["kv"]["blocks_used"] == 0 and led["requests"]["running"] == 0 and led["requests"]["waiting"] == 0:
                break
            time.sleep(0.5)
        counters = metrics(server.url)
        log = server.log()
    errors = run["summary"]["errors"]
    lost = sum(n for kind, n in errors.items() if kind in LOST or kind.startswith("http_5"))
    served_5xx = sum(v for (name, labels), v in counters.items()
                     if name == "tally:request_error_total" and json.loads(labels)["code"].startswith("5"))
    bad_not_4xx = sum(n for status, n in chaos.bad_status.items() if not status.startswith("4"))
    checks = {
        "no request lost or hung": lost == 0,
        "leaving clients never failed": not chaos.left_failed,
        "every bad request got a 4xx": bad_not_4xx == 0 and chaos.bad_unanswered == 0,
        "no 5xx served": served_5xx == 0,
        "KV pool whole again": led.get("kv", {}).get("blocks_used", -1) == 0,
        "no traceback in the log": "Traceback" not in log,
        "memory and fragmentation flat": run.get("soak", {}).get("verdict") in ("stable", "insufficient data"),
    }
    result = {"duration_s": a.duration, "capacity_rps": capacity_rps, "rate_rps": rate,
              "load": run["summary"]["counts"], "load_errors": errors, "chaos": asdict(chaos),
              "soak": {k: run.get("soak", {}).get(k) for k in ("verdict", "flags")}, "checks": checks,
              "ledger_after": led, "command": " ".join(sys.argv)}
    (a.out / "soak.json").write_text(json.dumps(result, indent=2))
    print(f"\nsoak {a.duration:.0f} s at {rate:.2f} req/s (capacity {capacity_rps:.2f} req/s measured first)")
    print(f"load: {_listed(run['summary']['counts'])}; errors: {_listed(errors) or 'none'}")
    print(f"chaos: {chaos.left} clients left mid-stream, bad requests by status: {_listed(chaos.bad_status)}")
    print(f"soak verdict: {result['soak']['verdict']} {', '.join(map(str, result['soak']['flags'] or []))}")
    for name, ok in checks.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    print(f"result: {a.out / 'soak.json'}\ncommand: python {' '.join(sys.argv)}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
