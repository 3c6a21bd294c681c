from __future__ import annotations

from tally.core.block_pool import BlockPool
from tally.core.kv_manager import KVCacheManager
from tally.core.request import Request


def _req(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, max_tokens=8, arrival_time=0.0)


def _run_prefill(kv: KVCacheManager, req: Request) -> int:
    cached = kv.find_cached_prefix(req)
    num_cached = len(cached) * kv.block_size
    assert kv.allocate(req, req.num_tokens - num_cached, cached)
    req.num_computed_tokens = req.num_tokens
    kv.cache_computed_blocks(req)
    return num_cached


def test_prefix_hit_reuses_full_blocks_and_leaves_last_token_to_compute():
    kv = KVCacheManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    a = _req("a", list(range(10)))
    assert _run_prefill(kv, a) == 0
    b = _req("b", list(range(10)) + [99])
    assert _run_prefill(kv, b) == 8  # two full blocks shared, partial third not
    assert kv.block_table("a")[:2] == kv.block_table("b")[:2]
    exact = _req("c", list(range(8)))  # prompt is exactly two full blocks: the last must be recomputed
    assert _run_prefill(kv, exact) == 4


def test_prefix_cache_compares_tokens_to_rule_out_hash_collisions():
    pool = BlockPool(4)
    [block] = pool.allocate(1)
    pool.register(block, block_hash=123, token_ids=(1, 2, 3, 4))
    assert pool.lookup(123, (1, 2, 3, 4)) is block
    assert pool.lookup(123, (9, 9, 9, 9)) is None


def test_freed_cached_blocks_are_evicted_lru_and_only_when_plain_blocks_run_out():
    kv = KVCacheManager(num_blocks=4, block_size=2, enable_prefix_caching=True)
    a = _req("a", [1, 2, 3, 4, 5])  # 3 blocks: 2 full (cached), 1 partial
    _run_prefill(kv, a)
    kv.free(a)
    assert kv.pool.num_free_blocks == 4 and kv.pool.num_cached_free_blocks == 2
    b = _req("b", [7, 8, 9, 10, 11])  # needs 3 blocks: the 2 plain ones, then one cached
    _run_prefill(kv, b)
    assert kv.pool.num_cached_free_blocks == 1
    c = _req("c", [1, 2, 3, 4, 6])
    # Blocks are released tail first, so the tail block [3, 4] was the LRU victim and the head survives.
    assert len(kv.find_cached_prefix(c)) == 1


def test_allocation_fails_cleanly_when_pool_is_full():
    kv = KVCacheManager(num_blocks=2, block_size=4, enable_prefix_caching=False)
    a = _req("a", list(range(8)))
    assert kv.allocate(a, 8)
    b = _req("b", [1])
    assert not kv.allocate(b, 1)
    assert kv.block_table("b") == []
    kv.free(a)
    assert kv.allocate(b, 1)


def test_ref_counts_return_to_zero_after_sharing():
    kv = KVCacheManager(num_blocks=8, block_size=2, enable_prefix_caching=True)
    reqs = [_req(str(i), [5, 6, 7, 8, i]) for i in range(3)]
    for r in reqs:
        _run_prefill(kv, r)
    shared = kv.pool.blocks[kv.block_table("0")[0]]
    assert shared.ref_count == 3
    for r in reqs:
        kv.free(r)
    assert all(b.ref_count == 0 for b in kv.pool.blocks)
    assert kv.pool.num_free_blocks == 8


def test_salt_separates_prefix_cache_entries():
    kv = KVCacheManager(num_blocks=8, block_size=2, enable_prefix_caching=True)
    a = Request("a", [1, 2, 3], 4, 0.0, cache_salt="tenant-a")
    _run_prefill(kv, a)
    b = Request("b", [1, 2, 3], 4, 0.0, cache_salt="tenant-b")
    assert kv.find_cached_prefix(b) == []


def test_sliding_window_gives_back_blocks_no_future_query_sees():
    kv = KVCacheManager(num_blocks=8, block_size=2, enable_prefix_caching=False, sliding_window=3)
    r = _req("w", list(range(10, 20)))  # 10 tokens: 5 blocks
    assert kv.allocate(r, 10)
    r.num_computed_tokens = 10
    kv.release_out_of_window(r)
    # The next query is position 10; it sees keys 8 and 9 (> 10 - 3): blocks 0..3 are dead.
    assert kv.num_held_blocks("w") == 1 and kv.pool.num_free_blocks == 7
    assert len(kv.block_table("w")) == 5  # places kept: positions still index the table
    kv.free(r)
    assert kv.pool.num_free_blocks == 8 and all(b.ref_count == 0 for b in kv.pool.blocks)


def test_without_a_window_nothing_is_released_early():
    kv = KVCacheManager(num_blocks=8, block_size=2, enable_prefix_caching=False)
    r = _req("x", list(range(10, 20)))
    assert kv.allocate(r, 10)
    r.num_computed_tokens = 10
    kv.release_out_of_window(r)
    assert kv.num_held_blocks("x") == 5
