"""Overload is refused fairly: --max-queue counts only requests that cannot start now, so free batch slots are
filled before anyone gets a 429, and every 429 carries Retry-After. Progress is read from the server's /ledger,
and the requests are too long to finish during the test, so no outcome depends on the CPU's speed."""
from __future__ import annotations

import threading

import httpx
import pytest
from support.ledger_polling import expect_ledger
from support.servers import started
from support.tiny_models import make_checkpoint

from tally.server.process import ServerProcess

MODEL = "tiny"
CONTEXT = 65536
SLOTS, QUEUE, CLIENTS = 16, 4, 30


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """`--max-queue` behind SLOTS batch slots; and two slots where a request may wait at most 0.1 s for one by the
    measured start rate. Started side by side."""
    ckpt = make_checkpoint(tmp_path_factory.mktemp("tiny-64k"), "llama", max_position_embeddings=CONTEXT)
    flags = ["--model", str(ckpt), "--served-model-name", MODEL, "--dtype", "float32", "--max-model-len",
             str(CONTEXT), "--kv-cache-memory", "64MB", "--log-level", "warning"]
    with started(ServerProcess([*flags, "--max-num-seqs", str(SLOTS), "--max-queue", str(QUEUE)]),
                 ServerProcess([*flags, "--max-num-seqs", "2", "--max-queue-delay", "0.1"])) as pair:
        yield pair


@pytest.fixture(scope="module")
def server(servers):
    return servers[0]


def test_free_slots_are_filled_before_anyone_is_refused(server):
    statuses: list[tuple[int, str | None]] = []
    lock, release = threading.Lock(), threading.Event()

    def client(i: int) -> None:
        body = {"model": MODEL, "prompt": f"request {i}", "max_tokens": CONTEXT - 64, "ignore_eos": True,
                "stream": True}
        with httpx.stream("POST", server.base_url + "/completions", json=body, timeout=120) as r:
            with lock:
                statuses.append((r.status_code, r.headers.get("retry-after")))
            if r.status_code == 200:
                release.wait(120)  # hold the stream open until the test has counted; leaving aborts it

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    try:
        expect_ledger(server, lambda led: len(statuses) == CLIENTS, "an answer to every client")
        admitted = [s for s, _ in statuses if s == 200]
        refused = [(s, retry) for s, retry in statuses if s != 200]
        assert len(admitted) == SLOTS + QUEUE, statuses  # every free slot, then the queue
        assert all(s == 429 and retry and int(retry) >= 1 for s, retry in refused), refused
        expect_ledger(server, lambda led: led["requests"]["running"] == SLOTS and led["requests"]["waiting"] == QUEUE,
                      "a full batch and the queue behind it")
    finally:
        release.set()
        for t in threads:
            t.join(120)
    expect_ledger(server, lambda led: led["kv"]["blocks_used"] == 0 and led["requests"]["running"] == 0,
                  "every left stream aborted and its blocks freed")


@pytest.fixture(scope="module")
def impatient(servers):
    return servers[1]


def test_a_request_whose_predicted_wait_is_too_long_is_refused_early(impatient):
    """With both slots held by requests that will not end soon, at most 2 requests started in any second, so a
    request with 2 ahead of it waits at least a second by the start rate: over --max-queue-delay 0.1."""
    server, release = impatient, threading.Event()
    statuses: list[int] = []

    def hold(i: int) -> None:
        body = {"model": MODEL, "prompt": f"hold {i}", "max_tokens": CONTEXT - 64, "ignore_eos": True,
                "stream": True}
        with httpx.stream("POST", server.base_url + "/completions", json=body, timeout=120) as r:
            statuses.append(r.status_code)
            if r.status_code == 200:
                release.wait(120)

    holders = [threading.Thread(target=hold, args=(i,)) for i in range(2)]
    for t in holders:
        t.start()
    try:
        expect_ledger(server, lambda led: led["requests"]["running"] == 2, "both slots taken")
        queued = threading.Thread(target=hold, args=(2,))  # nothing waits yet: it is never refused
        queued.start()
        holders.append(queued)
        expect_ledger(server, lambda led: led["requests"]["waiting"] == 1, "one request waiting")
        r = httpx.post(server.base_url + "/completions", json={"model": MODEL, "prompt": "late", "max_tokens": 2})
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1, r.text
        assert "--max-queue-delay" in r.json()["error"]["message"]
    finally:
        release.set()
        for t in holders:
            t.join(120)
    assert statuses.count(200) == 3


def test_a_request_counts_its_prompts_times_n_against_the_queue(server):
    """One request's sequences are admitted as that many requests: more than the slots and the queue together can
    never be (400), as many fill them (200), and the next request finds the queue full (429)."""
    too_many = {"model": MODEL, "prompt": [[1, 2, 3]] * 3, "n": 8, "max_tokens": 2}
    r = httpx.post(server.base_url + "/completions", json=too_many, timeout=120)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
    assert "--max-queue" in r.json()["error"]["message"]
    fill = {"model": MODEL, "prompt": [[1, 2, 3]] * 2, "n": (SLOTS + QUEUE) // 2, "max_tokens": CONTEXT - 64,
            "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.base_url + "/completions", json=fill, timeout=120) as held:
        assert held.status_code == 200
        expect_ledger(server, lambda led: led["requests"]["running"] == SLOTS and led["requests"]["waiting"] == QUEUE,
                      "every slot and the queue taken by one request")
        r = httpx.post(server.base_url + "/completions", json={"model": MODEL, "prompt": "late", "max_tokens": 2},
                       timeout=120)
        assert r.status_code == 429, r.text
    expect_ledger(server, lambda led: led["kv"]["blocks_used"] == 0 and led["requests"]["running"] == 0,
                  "the held request aborted and its blocks freed")
