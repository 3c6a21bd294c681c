"""`tally serve --tensor-parallel-size 2` as users start it: one command that starts its second rank itself, and one
command per "node" under torchrun (two torchrun agents on this machine, c10d rendezvous); `-pp 2` the same way.
Rank 0 serves the OpenAI API with the greedy text of one process; a rank that dies turns /health to 503, never a
hang."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from support.servers import started

from tally import LLM, SamplingParams
from tally.server.process import ServerProcess, free_port

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def expected(tiny_llama) -> str:
    out = LLM(str(tiny_llama)).generate([PROMPT], SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)
    return out[0].outputs[0].text


@pytest.fixture(scope="module")
def servers(tiny_llama):
    """`-tp 2` and `-pp 2`, started side by side (each command starts its second rank itself)."""
    with started(ServerProcess([str(tiny_llama), "--tensor-parallel-size", "2"], startup_timeout_s=180),
                 ServerProcess([str(tiny_llama), "-pp", "2"], startup_timeout_s=180)) as pair:
        yield pair


def _complete(server: ServerProcess) -> str:
    client = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=60)
    out = client.completions.create(model=client.models.list().data[0].id, prompt=PROMPT, max_tokens=12,
                                    temperature=0)
    return out.choices[0].text


def _children(pid: int, marker: str) -> list[int]:
    """Processes whose parent is `pid` and whose command line holds `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and marker in cmdline:
            found.append(int(entry.name))
    return found


def _wait_for(condition, timeout_s: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.5)
    return False


def test_one_command_serves_with_two_ranks_and_fails_cleanly_when_one_dies(servers, expected):
    server = servers[0]
    assert _complete(server) == expected
    ranks = httpx.get(server.url + "/ledger").json()["plan"]["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    follower, = _children(server.proc.pid, "tally.engine.parallel.follower")
    os.kill(follower, 9)
    # seen while idle (the engine loop watches the ranks it started), before any request needs the rank
    assert _wait_for(lambda: httpx.get(server.url + "/health").status_code == 503)
    with pytest.raises(openai.APIStatusError) as failed:
        _complete(server)
    assert failed.value.status_code == 503
    assert server.proc.poll() is None  # the server says so instead of vanishing
    assert "parallel rank 1 exited" in server.log()


def test_one_command_serves_two_pipeline_stages(servers, expected):
    server = servers[1]
    assert _complete(server) == expected
    ranks = httpx.get(server.url + "/ledger").json()["plan"]["ranks"]
    assert [(r["stage"], r["layers"]) for r in ranks] == [(0, [0, 1]), (1, [1, 2])]


def test_two_torchrun_nodes_serve_as_one(tiny_llama, expected):
    port, rdzv = free_port(), free_port()
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{rdzv}", "-m", "tally.cli", "serve",
               str(tiny_llama), "--tensor-parallel-size", "2", "--threads", "1", "--host", "127.0.0.1",
               "--port", str(port)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    second = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    server = ServerProcess([], startup_timeout_s=180, command=lambda _: command)
    server.port, server.url = port, f"http://127.0.0.1:{port}"  # the same command on both nodes: rank 0 serves
    try:
        server.start()
        assert _complete(server) == expected
        assert len(httpx.get(server.url + "/ledger").json()["plan"]["ranks"]) == 2
    finally:
        server.stop()
        second.terminate()  # torchrun passes the signal on to its rank
        try:
            second.wait(60)
        finally:
            second.kill()
