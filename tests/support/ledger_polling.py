"""Watching a running `tally serve` through its own /ledger, so a test waits for what the server reports
(a request running, queued, its blocks freed) instead of guessing from a timer how far the server got.

Every timeout here is an upper bound for "it never happened", never a measurement: the helpers return
as soon as the condition holds, and `expect_ledger` fails with the last ledger read when it never does."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx

Predicate = Callable[[dict], bool]
POLL_S = 0.05
NEVER_S = 120.0  # far beyond anything a tiny model needs on any CPU: reaching it means "never"


def ledger(server) -> dict:
    return httpx.get(server.url + "/ledger", timeout=30).json()


def wait_for_ledger(server, predicate: Predicate, timeout_s: float = NEVER_S) -> dict:
    """The ledger as soon as `predicate` holds, or the last one read when `timeout_s` ran out."""
    deadline = time.monotonic() + timeout_s
    while True:
        led = ledger(server)
        if predicate(led) or time.monotonic() > deadline:
            return led
        time.sleep(POLL_S)


def expect_ledger(server, predicate: Predicate, what: str, timeout_s: float = NEVER_S) -> dict:
    """wait_for_ledger, failing the test (with `what` and the last ledger) if `predicate` never held."""
    led = wait_for_ledger(server, predicate, timeout_s)
    assert predicate(led), f"the server never reported {what}: requests {led['requests']}, kv {led['kv']}"
    return led


async def await_ledger(server, predicate: Predicate, what: str, timeout_s: float = NEVER_S) -> dict:
    """expect_ledger for a test that drives the server from an event loop: the loop keeps serving the
    test's own streams while it waits."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    async with httpx.AsyncClient(timeout=30) as c:
        while True:
            led = (await c.get(server.url + "/ledger")).json()
            if predicate(led) or asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(POLL_S)
    assert predicate(led), f"the server never reported {what}: requests {led['requests']}, kv {led['kv']}"
    return led


def idle(led: dict) -> bool:
    """No request runs or holds a KV block (an abort frees its blocks before the next step)."""
    return led["kv"]["blocks_used"] == 0 and led["requests"]["running"] == 0 and led["requests"]["queued"] == 0


def kv_tokens(led: dict) -> int:
    """Tokens the server's KV pool holds at once."""
    return led["kv"]["blocks_total"] * led["kv"]["block_size_tokens"]
