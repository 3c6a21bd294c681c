"""The swap space (vLLM's --swap-space): RAM outside the KV pool where a preempted request's full blocks wait
instead of being recomputed when it resumes (the scheduler's side: tally/core/kv_tiers.py:SwapTier)."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import torch

from tally.attention.kv_blocks import ExactBlocks, Int8Blocks
from tally.core.request import Request
from tally.engine.kv_tiers.stats import SwapStats

MEASURED_BLOCKS = 8  # blocks copied out and back at start-up to price a swap before the first one
NEW_TIMING_WEIGHT = 0.5  # of each swap's own time in the running per-block figures


class SwapSpace:
    """Whether a preemption swaps is decided by measurement, per preemption (`--preemption-mode auto`): copying its
    blocks out and back (seconds per block, timed on the pool at start-up and then on every swap) against recomputing
    their tokens (the engine's fitted step cost, tally/engine/step_cost.py). On a CPU a block's copy costs a fraction of
    a millisecond and its prefill tens of milliseconds, so swapping wins while there is room; `swap` and `recompute` fix
    the choice. The blocks are kept as the pool holds them, the last, partial one included, so a resumed request goes on
    from exactly the KV it had (an int8 pool's blocks are int8 already; recomputing a partial int8 block would quantize
    it afresh, and change what follows), unless `--swap-space-dtype int8` asks for int8 copies of a float pool. A draft
    model's KV in the same blocks goes along (tally/attention/kv_blocks.py:block_tensors)."""
    def __init__(self, codec: ExactBlocks | Int8Blocks, capacity_bytes: int, block_size: int, mode: str,
                 recompute_seconds: Callable[[int], float | None]) -> None:
        """`recompute_seconds(tokens)`: what prefilling that many tokens costs now (None: not known yet)."""
        self.codec = codec
        self.block_size = block_size
        self.mode = mode
        self.recompute_seconds = recompute_seconds
        self._held: dict[str, tuple[torch.Tensor, int]] = {}  # request id -> (its blocks' rows, tokens they hold)
        self.stats = SwapStats(capacity_bytes=capacity_bytes)
        self._measure()

    def _measure(self, repeats: int = 3) -> None:
        """Copy a few blocks out and back into the same blocks; nobody holds them at start-up."""
        ids = torch.arange(min(MEASURED_BLOCKS, len(self.codec.tensors[0])))
        out_s = in_s = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            data = self.codec.read(ids)
            t1 = time.perf_counter()
            self.codec.write(ids, data)
            t2 = time.perf_counter()
            out_s, in_s = min(out_s, t1 - t0), min(in_s, t2 - t1)
        self.stats.out_s_per_block, self.stats.in_s_per_block = out_s / len(ids), in_s / len(ids)

    def swap_out(self, req: Request, block_ids: list[int]) -> bool:
        tokens = min(req.num_computed_tokens, req.num_tokens - 1)  # the last token's logits are computed anyway
        n, s = -(-tokens // self.block_size), self.stats
        if n == 0 or len(block_ids) < n or s.held_bytes + n * self.codec.nbytes > s.capacity_bytes:
            return False
        if self.mode == "auto":
            s.last_swap_s = n * (s.out_s_per_block + s.in_s_per_block)
            s.last_recompute_s = self.recompute_seconds(tokens)
            if s.last_recompute_s is None or s.last_swap_s >= s.last_recompute_s:
                return False
        started = time.perf_counter()
        data = self.codec.read(torch.tensor(block_ids[:n]))
        s.out_s_per_block = _blend(s.out_s_per_block, (time.perf_counter() - started) / n)
        self._held[req.request_id] = (data, tokens)
        s.held_bytes += data.numel()
        s.num_requests = len(self._held)
        s.swapped_out_blocks += n
        s.num_swapped += 1
        return True

    def swapped_tokens(self, request_id: str) -> int:
        held = self._held.get(request_id)
        return 0 if held is None else held[1]

    def swap_in(self, request_id: str, block_ids: list[int]) -> None:
        data = self._forget(request_id)
        n = len(data)
        started = time.perf_counter()
        self.codec.write(torch.tensor(block_ids[:n]), data)
        s = self.stats
        s.in_s_per_block = _blend(s.in_s_per_block, (time.perf_counter() - started) / n)
        s.swapped_in_blocks += n

    def discard(self, request_id: str) -> None:
        if request_id in self._held:
            self._forget(request_id)

    def _forget(self, request_id: str) -> torch.Tensor:
        data, _ = self._held.pop(request_id)
        self.stats.held_bytes -= data.numel()
        self.stats.num_requests = len(self._held)
        return data

    def snapshot(self) -> SwapStats:
        return replace(self.stats)


def _blend(old: float, new: float) -> float:
    return (1 - NEW_TIMING_WEIGHT) * old + NEW_TIMING_WEIGHT * new
