"""`tally route --canary` in front of real `tally serve` replicas, with plan steps of seconds: an identical canary
is walked to 100%, one that truncates its answers is rolled back at the first evaluation that has enough samples,
no request is lost either way, and the audit log says why each step happened — from the proxy's measurements
and, as a second source, from each replica's own /metrics. Byte-for-byte streaming is pinned
against an in-process upstream whose bytes are fixed (a real server's event boundaries vary with timing). Bad plans
and rules files are refused before the proxy starts.

The worse canary is the same model with a shorter --max-model-len: chat requests without max_tokens (and with
ignore_eos) run to the model length, so its answers are deterministically shorter — the output-length drift a
mean_output_tokens rule exists to catch."""
from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, StreamingResponse
from starlette.routing import Route
from support.servers import started

from tally.ops import route_cli
from tally.server.process import ServerProcess, free_port

FLAGS = ["--served-model-name", "tiny", "--dtype", "float32", "--kv-cache-memory", "8MB", "--log-level", "warning"]
RULES = """\
min_samples: 5
window: 3s
rules:
  - {metric: error_rate, max_increase: 0}
  - {metric: mean_output_tokens, min_ratio: 0.8}
  - {metric: length_share, max_increase: 5%}
"""
BACKEND_RULES = """\
  - {metric: mean_output_tokens, min_ratio: 0.8, source: backend}
  - {metric: length_share, max_increase: 5%, source: backend}
  - {metric: error_rate, max_increase: 0, source: backend}
"""


@pytest.fixture(scope="module")
def servers(tiny_llama):
    """stable, an identical canary, and a canary whose answers are cut short."""
    with started(*(ServerProcess([str(tiny_llama), *FLAGS, "--max-model-len", str(n)]) for n in (64, 64, 32))) as s:
        yield s


def _router(stable, canary, tmp_path: Path, plan: str, *extra: str, rules: str = RULES) -> ServerProcess:
    (tmp_path / "rules.yaml").write_text(rules)
    args = ["--replica", stable.url, "--canary", canary.url, "--plan", plan, "--rules", str(tmp_path / "rules.yaml"),
            "--eval-interval", "0.5s", "--audit-log", str(tmp_path / "audit.jsonl"),
            "--health-interval", "5",  # rare checks with a long timeout: a slow machine must not take a side out
            *extra]
    return ServerProcess([], command=lambda port: [sys.executable, "-m", "tally.cli", "route", *args,
                                                   "--port", str(port)])


class Traffic:
    """Workers sending chat requests in a loop, every other one streamed, until stopped; each answer is checked
    whole, and anything less is a lost request."""

    def __init__(self, base_url: str, workers: int = 4, sticky: bool = False) -> None:
        self.base_url, self.sticky = base_url, sticky
        self.completed, self.lost = 0, []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(w,)) for w in range(workers)]

    def _run(self, worker: int) -> None:
        client = openai.OpenAI(base_url=self.base_url, api_key="x", max_retries=0, timeout=60)
        i = 0
        while not self.stop.is_set():
            i += 1
            headers = {"X-Session-Id": f"session-{worker}-{i % 3}"} if self.sticky and worker % 2 else {}
            kw = dict(model="tiny", messages=[{"role": "user", "content": f"q{worker} {i}"}], temperature=0,
                      extra_body={"ignore_eos": True}, extra_headers=headers)
            try:
                if i % 2:
                    chunks = list(client.chat.completions.create(**kw, stream=True,
                                                                 stream_options={"include_usage": True}))
                    finished = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
                    ok = finished == ["length"] and chunks[-1].usage.completion_tokens > 0
                else:
                    answer = client.chat.completions.create(**kw)
                    ok = answer.choices[0].finish_reason == "length" and answer.usage.completion_tokens > 0
                lost = None if ok else f"worker {worker} request {i}: incomplete answer"
            except Exception as e:  # whatever the cause, the client did not get its whole answer
                lost = f"worker {worker} request {i}: {e!r}"
            with self.lock:
                self.completed += 1
                self.lost += [lost] if lost else []

    def __enter__(self) -> Traffic:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()


def _wait_until_decided(router: ServerProcess, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = httpx.get(router.url + "/router/canary").json()
        if status["phase"] != "running":
            return status
        time.sleep(0.2)
    return status


def _served(router: ServerProcess) -> dict[str, int]:
    return {r["side"]: r["served"] for r in httpx.get(router.url + "/router/status").json()["replicas"]}


def _served_once_drained(router: ServerProcess, side: str, timeout_s: float = 30.0) -> int:
    """`side`'s served count once the requests sent to it before a decision have answered (they count when they do)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        replica, = (r for r in httpx.get(router.url + "/router/status").json()["replicas"] if r["side"] == side)
        if replica["in_flight"] == 0:
            return replica["served"]
        time.sleep(0.05)
    raise AssertionError(f"{side} still has requests in flight {timeout_s:g} s after the decision")


def _audit(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]


def test_an_identical_canary_is_walked_to_100_percent_and_no_request_is_lost(servers, tmp_path):
    stable, twin, _ = servers
    with _router(stable, twin, tmp_path, "30%:2s,60%:2s,100%", rules=RULES + BACKEND_RULES) as router:
        with Traffic(router.base_url) as traffic:
            status = _wait_until_decided(router)
        audit = _audit(tmp_path)
        assert status["phase"] == "done", audit[-3:]
        assert traffic.lost == [] and traffic.completed > 0

        decisions = [r["decision"] for r in audit]
        assert decisions[0] == "start" and decisions[-1] == "done" and decisions.count("advance") == 1
        assert set(decisions) <= {"start", "hold", "continue", "advance", "done"}
        advance, done = audit[decisions.index("advance")], audit[-1]
        assert (advance["weight"], advance["next_weight"], done["weight"], done["next_weight"]) == (0.3, 0.6, 0.6, 1)
        for record in (advance, done):  # the figures behind the decision: both sides, every rule held
            assert all(r["verdict"] == "held" for r in record["rules"]), record
            assert {r["source"] for r in record["rules"]} == {"proxy", "backend"}
            for side in ("canary", "stable"):
                figures = record["sides"][side]
                assert figures["requests"] >= 5 and figures["errors"] == 0 and figures["length_share"] == 1.0
                assert figures["ttft_p99_s"] > 0 and figures["tpot_p99_s"] > 0 and figures["mean_output_tokens"] > 0
                backend = record["backend"][side]  # the same window, from the replica's own /metrics
                assert backend["prefix"] == "tally:" and backend["replicas"] == [(twin if side == "canary"
                                                                                   else stable).url]
                assert backend["requests"] >= 5 and backend["errors"] == 0 and backend["length_share"] == 1.0
                assert backend["ttft_p99_s"] > 0 and backend["mean_output_tokens"] > 0

        before = _served(router)
        client = openai.OpenAI(base_url=router.base_url, api_key="x", max_retries=0)
        for i in range(4):
            client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": f"x{i}"}])
        after = _served(router)
        assert (after["canary"] - before["canary"], after["stable"] - before["stable"]) == (4, 0)
        metrics = httpx.get(router.url + "/metrics").text
        assert "tally_route_canary_weight_ratio 1.0" in metrics
        assert 'tally_route_canary_decisions_total{decision="done"} 1.0' in metrics


@pytest.mark.parametrize("source", ["proxy", "backend"])
def test_a_canary_that_truncates_is_rolled_back_and_then_gets_no_traffic(servers, tmp_path, source):
    stable, _, short = servers
    rules = RULES if source == "proxy" else RULES.replace("min_ratio: 0.8}", "min_ratio: 0.8, source: backend}")
    with _router(stable, short, tmp_path, "50%:1h,100%", "--sticky-header", "X-Session-Id", rules=rules) as router:
        with Traffic(router.base_url, sticky=True) as traffic:
            status = _wait_until_decided(router)
            assert status["phase"] == "rolled_back", _audit(tmp_path)[-3:]
            canary_served = _served_once_drained(router, "canary")
            time.sleep(1.0)  # traffic goes on, sticky sessions included, after the rollback
        assert traffic.lost == [] and traffic.completed > 0
        assert _served(router)["canary"] == canary_served

        audit = _audit(tmp_path)
        decisions = [r["decision"] for r in audit]
        # Broken from its first answer: the first evaluation with min_samples on both sides rolls it back.
        assert decisions[0] == "start" and decisions[-1] == "rollback"
        assert set(decisions[1:-1]) <= {"hold"}
        rollback = audit[-1]
        assert rollback["next_weight"] == 0.0 and status["weight"] == 0.0
        name = "mean_output_tokens" + (" (backend)" if source == "backend" else "")
        assert rollback["reason"].startswith(f"{name}: canary") and status["reason"] == rollback["reason"]
        verdicts = {r["metric"]: r["verdict"] for r in rollback["rules"]}
        assert verdicts == {"error_rate": "held", "mean_output_tokens": "broken", "length_share": "held"}
        sides = rollback["sides" if source == "proxy" else "backend"]
        assert sides["canary"]["mean_output_tokens"] < 0.8 * sides["stable"]["mean_output_tokens"]
        metrics = httpx.get(router.url + "/metrics").text
        assert "tally_route_canary_weight_ratio 0.0" in metrics
        assert 'tally_route_canary_decisions_total{decision="rollback"} 1.0' in metrics


# An answer cut at awkward places: inside a line, inside a UTF-8 character, between the two newlines of an event.
CANNED = [b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n',
          b'data: {"choices":[{"index":0,"delta":{"content":"caf\xc3', b'\xa9 \xf0\x9f\x99',
          b'\x82"},"finish_reason":null}]}\n', b'\n: a comment line\n\ndata: {"choices":[{"index":0,"delta":',
          b'{"content":"!"},"finish_reason":"stop"}]}\n\ndata: {"choices":[],"usage":{"completion_tokens":3}}\n\n',
          b"data: [DONE]\n\n"]


class CannedUpstream:
    """An OpenAI-shaped server in this process that answers every chat request with CANNED, piece by piece."""

    def __init__(self) -> None:
        async def chat(_: Request) -> StreamingResponse:
            async def pieces():
                for piece in CANNED:
                    yield piece
                    await asyncio.sleep(0.01)
            return StreamingResponse(pieces(), media_type="text/event-stream")

        async def health(_: Request) -> PlainTextResponse:
            return PlainTextResponse("ok")

        app = Starlette(routes=[Route("/health", health), Route("/v1/chat/completions", chat, methods=["POST"])])
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> CannedUpstream:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join()


def test_streams_pass_through_byte_for_byte_and_are_measured_on_the_way(tmp_path):
    with CannedUpstream() as stable, CannedUpstream() as canary, _router(
            stable, canary, tmp_path, "50%:1h,100%", rules=RULES.replace("window: 3s", "window: 1h")) as router:
        for _ in range(6):
            with httpx.stream("POST", router.url + "/v1/chat/completions", json={"model": "m", "stream": True}) as r:
                assert b"".join(r.iter_raw()) == b"".join(CANNED)
        assert _served(router) == {"stable": 3, "canary": 3}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the next evaluation reads what the proxy saw of the six streams
            last = httpx.get(router.url + "/router/canary").json()["last_decision"]
            if last["decision"] == "hold" and all(last["sides"][s]["requests"] == 3 for s in ("canary", "stable")):
                break
            time.sleep(0.1)
        # no /metrics behind either side: nothing from that source, and the proxy's figures are unaffected
        assert "/metrics answered 404" in last["backend"]["canary"]["no_data"]
        for side in ("canary", "stable"):
            assert last["sides"][side] | {"ttft_p99_s": 0, "tpot_p99_s": 0} == {
                "requests": 3, "errors": 0, "error_rate": 0.0, "ttft_samples": 3, "ttft_p99_s": 0, "tpot_samples": 3,
                "tpot_p99_s": 0, "output_samples": 3, "mean_output_tokens": 3.0, "finished_choices": 3,
                "length_share": 0.0}


@pytest.mark.parametrize("args, says", [
    (["--canary", "http://127.0.0.1:2", "--plan", "5%:1h,100%"], "--canary needs --plan"),
    (["--canary", "http://127.0.0.1:2", "--plan", "5%:1h,100%", "--rules", "{missing}"], "cannot read it"),
    (["--canary", "http://127.0.0.1:2", "--plan", "50%:1h,20%:1h,100%", "--rules", "{rules}"], "must rise"),
    (["--canary", "http://127.0.0.1:2", "--plan", "5%:1x,100%", "--rules", "{rules}"], "is not a duration"),
    (["--canary", "http://127.0.0.1:2", "--plan", "5%:1h,100%", "--rules", "{bad_rules}"], "unknown metric"),
    (["--canary", "http://127.0.0.1:2", "--plan", "5%:1h,100%", "--rules", "{bad_source}"],
     "source 'metrics' is not one of proxy, backend"),
    (["--canary", "http://127.0.0.1:2", "--plan", "5%:1h,100%", "--rules", "{bad_floor}"],
     "min_delta_ms must be a number of milliseconds"),
    (["--canary", "http://127.0.0.1:1", "--plan", "5%:1h,100%", "--rules", "{rules}"], "both a --replica"),
    (["--plan", "5%:1h,100%", "--rules", "{rules}"], "go with --canary"),
])
def test_the_route_command_refuses_a_canary_it_could_not_roll_back(tmp_path, capsys, args, says):
    (tmp_path / "rules.yaml").write_text(RULES)
    (tmp_path / "bad.yaml").write_text("rules: [{metric: latency, max_ratio: 2}]")
    (tmp_path / "source.yaml").write_text("rules: [{metric: ttft_p99, max_ratio: 2, source: metrics}]")
    (tmp_path / "floor.yaml").write_text("rules: [{metric: ttft_p99, max_ratio: 2, min_delta_ms: 5ms}]")
    paths = {"missing": tmp_path / "nope.yaml", "rules": tmp_path / "rules.yaml", "bad_rules": tmp_path / "bad.yaml",
             "bad_source": tmp_path / "source.yaml", "bad_floor": tmp_path / "floor.yaml"}
    with pytest.raises(SystemExit) as exit_:
        route_cli.main(["--replica", "http://127.0.0.1:1", *(a.format(**paths) for a in args)])
    assert exit_.value.code == 2
    assert says in capsys.readouterr().err
