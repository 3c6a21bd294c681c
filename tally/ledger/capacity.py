"""How many requests fit: the memory budget of one device and the long-tail split of a workload.

Budget: device memory - runtime reserve - communication buffers - weights = KV pool, counted in
whole blocks. A request of L tokens holds ceil(L / block_size) blocks, so the concurrency that fits is
kv_blocks // blocks_per_request. The real constraint is concurrency x max length against the pool.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from tally.ledger.kv import KVLayout
from tally.ledger.length_percentiles import LengthStats
from tally.units import fmt_gib


@dataclass(frozen=True)
class MemoryBudget:
    device_bytes: int
    reserve_bytes: int  # activations, CUDA context and graphs, allocator slack
    comm_buffer_bytes: int  # tensor / pipeline parallel buffers (0 on one device)
    weight_bytes: int
    kv_pool_bytes: int  # what is left for KV; negative when the weights do not fit
    kv_blocks: int
    kv_tokens: int


def memory_budget(layout: KVLayout, *, device_bytes: int, weight_bytes: int, reserve_bytes: int,
                  comm_buffer_bytes: int = 0) -> MemoryBudget:
    pool = device_bytes - reserve_bytes - comm_buffer_bytes - weight_bytes
    blocks = layout.num_blocks_for_budget(pool)
    return MemoryBudget(device_bytes, reserve_bytes, comm_buffer_bytes, weight_bytes, pool, blocks,
                        blocks * layout.block_size)


def max_concurrency(layout: KVLayout, kv_blocks: int, tokens_per_request: int) -> int:
    return kv_blocks // max(layout.blocks_for_tokens(tokens_per_request), 1)


def max_len_for_concurrency(layout: KVLayout, kv_blocks: int, concurrency: int) -> int:
    """The longest max_model_len at which `concurrency` requests all fit (whole blocks)."""
    return (kv_blocks // max(concurrency, 1)) * layout.block_size


def oversubscription_warning(layout: KVLayout, budget: MemoryBudget, *, concurrency: int, max_len: int) -> str | None:
    """The warning a team needs when concurrency x max length does not fit the KV pool."""
    need_bytes = concurrency * layout.bytes_for_tokens(max_len)
    if need_bytes <= max(budget.kv_pool_bytes, 0):
        return None
    fits = max_concurrency(layout, budget.kv_blocks, max_len)
    return (f"{concurrency} concurrent requests x {max_len:,} tokens need {fmt_gib(need_bytes)} of KV cache but "
            f"the pool holds {fmt_gib(max(budget.kv_pool_bytes, 0))}: only {fits} fit at that length. "
            f"Lower --concurrency to {fits}, or --max-model-len to "
            f"{max_len_for_concurrency(layout, budget.kv_blocks, concurrency):,}, or make room "
            "(quantized KV or weights, -tp, bigger devices)")


@dataclass(frozen=True)
class LongTailPlan:
    percentile: float  # the share of requests the main pool is sized for
    max_model_len: int  # recommended: that percentile of total length, rounded up to a block
    concurrency_at_max_model_len: int
    concurrency_at_mean_len: int  # paged blocks are taken as tokens arrive: what fits on average
    theoretical_max_len: int  # the model's context (or --max-model-len)
    concurrency_at_theoretical_max_len: int
    tail_request_share: float  # share of requests longer than max_model_len
    tail_slot_share: float  # share of in-flight slots they hold (weighted by output length)
    tail_max_len: int  # the longest request seen, rounded up to a block
    tail_concurrency: int  # slots the long-tail pool needs next to the main pool's concurrency
    tail_pool_bytes: int  # KV bytes of the long-tail pool


def long_tail_plan(layout: KVLayout, kv_blocks: int, stats: LengthStats, *, percentile: float,
                   theoretical_max_len: int, main_concurrency: int | None = None) -> LongTailPlan:
    """Size the main pool for `percentile` of requests and a separate pool for the rest.

    The tail pool serves requests longer than max_model_len at the longest length seen. With the main
    pool running `main_concurrency` short requests (default: as many as fit), the tail needs
    main x share / (1 - share) slots, at least one if any request is that long."""
    block = layout.block_size
    recommended = -(-stats.total_at(percentile) // block) * block
    main = max_concurrency(layout, kv_blocks, recommended) if main_concurrency is None else main_concurrency
    slot_share = stats.slot_share_longer_than(recommended)
    tail_len = -(-stats.total_tokens["max"] // block) * block
    # The main pool holds the short requests, (1 - share) of the slots; the tail holds the rest.
    tail_concurrency = max(math.ceil(main * slot_share / max(1 - slot_share, 1e-9)), 1) if slot_share > 0 else 0
    return LongTailPlan(
        percentile=percentile,
        max_model_len=recommended,
        concurrency_at_max_model_len=max_concurrency(layout, kv_blocks, recommended),
        concurrency_at_mean_len=max_concurrency(layout, kv_blocks, math.ceil(stats.mean_total_tokens)),
        theoretical_max_len=theoretical_max_len,
        concurrency_at_theoretical_max_len=max_concurrency(layout, kv_blocks, theoretical_max_len),
        tail_request_share=stats.share_longer_than(recommended),
        tail_slot_share=slot_share,
        tail_max_len=tail_len,
        tail_concurrency=tail_concurrency,
        tail_pool_bytes=tail_concurrency * layout.bytes_for_tokens(tail_len),
    )


def pools_section(tail: LongTailPlan, main_concurrency: int) -> dict:
    """What `tally route --long-threshold` and `tally deploy k8s --plan` read of a plan: the threshold (the main
    pool's max_model_len) and each pool's length and concurrency."""
    return {"long_threshold_tokens": tail.max_model_len,
            "main": {"max_model_len": tail.max_model_len, "concurrency": main_concurrency},
            # the longest request seen, within the model's context (the plan warns of any beyond it)
            "long": {"max_model_len": min(tail.tail_max_len, tail.theoretical_max_len),
                     "concurrency": tail.tail_concurrency, "request_share": tail.tail_request_share}}
