"""Per-request block tables over the block pool, with prefix caching by chained block hashes.

A full block is named by hash(parent block's hash, its token ids, the request's salt), the first block's parent being
the request's LoRA adapter; a hit reuses the block and skips its prefill. Blocks full of prompt tokens are always
registered (n>1 siblings share a prompt even with prefix caching off); blocks holding generated tokens never are
(cache_computed_blocks says why). Under a sliding window, leading blocks no future query can see
go back while the request runs; the table keeps their places and counts them. A lookup that misses in the pool goes
on to the prefix tier below it (tally/core/kv_tiers.py), whose blocks are read into free pool blocks and count as hits;
every newly registered block is handed to the tier."""
from __future__ import annotations

from dataclasses import dataclass

from tally.core.block_pool import Block, BlockPool
from tally.core.kv_tiers import PrefixTier, extend_block_keys
from tally.core.request import Request


@dataclass
class PrefixCacheStats:
    queried_tokens: int = 0  # prompt tokens of requests at first admission
    hit_tokens: int = 0  # of those, tokens reused from the cache


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool,
                 sliding_window: int | None = None, prefix_tier: PrefixTier | None = None) -> None:
        self.pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.sliding_window = sliding_window
        self.stats = PrefixCacheStats()
        self.prefix_tier = prefix_tier if enable_prefix_caching else None
        self._blocks: dict[str, list[Block]] = {}
        self._num_registered: dict[str, int] = {}
        self._filled_tokens: dict[str, int] = {}  # tokens each request's blocks will hold after this step
        self._num_released: dict[str, int] = {}  # leading table entries given back (sliding window)

    # -- queries -------------------------------------------------------------------------------
    def block_table(self, request_id: str) -> list[int]:
        return [b.block_id for b in self._blocks.get(request_id, ())]

    def held_block(self, request_id: str, index: int) -> int | None:
        """The block at this place of the request's table, None where it has none (or gave it back)."""
        blocks = self._blocks.get(request_id, ())
        return blocks[index].block_id if self._num_released.get(request_id, 0) <= index < len(blocks) else None

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_used_blocks(self) -> int:
        return self.pool.num_blocks - self.pool.num_free_blocks

    def num_unfilled_slots(self) -> int:
        """Allocated slots holding no token yet (the numerator of fragmentation)."""
        return sum(len(blocks) * self.block_size - self._filled(rid) for rid, blocks in self._blocks.items())

    def num_held_blocks(self, request_id: str) -> int:
        """Blocks the request holds a reference to (its table minus entries released behind the window)."""
        return len(self._blocks.get(request_id, ())) - self._num_released.get(request_id, 0)

    def swappable_blocks(self, req: Request) -> list[int]:
        """The request's blocks holding computed tokens, for the swap space; none once leading blocks went back
        behind a sliding window (a swap-in could not give them back again)."""
        if self._num_released.get(req.request_id, 0):
            return []
        return self.block_table(req.request_id)[:self.blocks_needed(req.num_computed_tokens)]

    def _filled(self, request_id: str) -> int:
        return self._filled_tokens.get(request_id, 0)

    # -- prefix cache -------------------------------------------------------------------------
    def _update_hashes(self, req: Request) -> None:
        bs = self.block_size
        hashes = req.block_hashes
        for i in range(len(hashes), req.num_tokens // bs):
            parent = hashes[-1] if hashes else req.lora_key  # an adapter's KV differs from the base's
            hashes.append(hash((parent, tuple(req.token_ids[i * bs:(i + 1) * bs]), req.cache_salt)))

    def find_cached_prefix(self, req: Request) -> list[Block]:
        """Blocks that already hold a prefix of req's known tokens (no references taken).
        At least one token is always left to compute, since its logits are needed."""
        if req.skip_prefix_cache or not (self.enable_prefix_caching or req.parent is not None):
            return []
        self._update_hashes(req)
        bs = self.block_size
        max_blocks = (req.num_tokens - 1) // bs
        hits: list[Block] = []
        for i, h in enumerate(req.block_hashes[:max_blocks]):
            block = self.pool.lookup(h, tuple(req.token_ids[i * bs:(i + 1) * bs]))
            if block is None:
                break
            hits.append(block)
        if self.prefix_tier is not None and len(hits) < max_blocks:
            hits += self._promote(req, hits, max_blocks)
        return hits

    def _promote(self, req: Request, hits: list[Block], max_blocks: int) -> list[Block]:
        """The prefix tier's run of blocks after the pool's hits, read into blocks free now and registered (ref count
        0, newest in the LRU). The pool's hits are held meanwhile, so taking free blocks never evicts them."""
        first, bs = len(hits), self.block_size
        keys = extend_block_keys(req, bs, max_blocks)
        last = first
        while last < max_blocks and self.prefix_tier.holds(keys[last]):
            last += 1
        if last == first:
            return []
        for block in hits:
            self.pool.touch(block)
        blocks = self.pool.allocate(min(last - first, self.pool.num_free_blocks))
        loaded = self.prefix_tier.load(keys[first:first + len(blocks)], [b.block_id for b in blocks])
        promoted = 0
        for i, block in enumerate(blocks[:loaded], first):
            if not self.pool.register(block, req.block_hashes[i], tuple(req.token_ids[i * bs:(i + 1) * bs])):
                break  # the pool holds this block after all (a later one than its first miss): the run ends here
            promoted += 1
        self.pool.release(list(reversed(hits + blocks)))
        return blocks[:promoted]

    # -- allocation ----------------------------------------------------------------------------
    def allocate(self, req: Request, num_new_tokens: int, cached: list[Block] = ()) -> bool:
        """Make room for req's next num_new_tokens (after any cached prefix). False, and nothing
        changed, when the pool cannot hold them."""
        blocks = self._blocks.get(req.request_id, [])
        num_computed = req.num_computed_tokens + len(cached) * self.block_size
        need = self.blocks_needed(num_computed + num_new_tokens) - len(blocks) - len(cached)
        reviving = sum(1 for b in cached if b.ref_count == 0)  # cached-free blocks we are about to take
        if need > self.pool.num_free_blocks - reviving:
            return False
        for block in cached:
            self.pool.touch(block)
        blocks = self._blocks.setdefault(req.request_id, blocks)
        blocks.extend(cached)
        if need > 0:
            blocks.extend(self.pool.allocate(need))
        self._filled_tokens[req.request_id] = num_computed + num_new_tokens
        return True

    def record_first_admission(self, req: Request, num_cached_tokens: int) -> None:
        self.stats.queried_tokens += req.num_prompt_tokens
        self.stats.hit_tokens += num_cached_tokens

    def cache_computed_blocks(self, req: Request) -> None:
        """Register blocks that became full of computed prompt tokens. A generated token's KV comes from a decode
        row, and a prompt holding it (a conversation's next turn) computes it as a prompt row, whose bits differ on
        the integer kernels: reusing the decode rows would make the next turn's answer depend on the cache."""
        self._update_hashes(req)
        blocks = self._blocks[req.request_id]
        start = max(self._num_registered.get(req.request_id, 0), self._num_released.get(req.request_id, 0))
        end = min(min(req.num_computed_tokens, req.num_prompt_tokens) // self.block_size, len(req.block_hashes))
        bs = self.block_size
        new = [i for i in range(start, end)
               if self.pool.register(blocks[i], req.block_hashes[i], tuple(req.token_ids[i * bs:(i + 1) * bs]))]
        self._num_registered[req.request_id] = max(start, end)
        if new and self.prefix_tier is not None:
            keys = extend_block_keys(req, bs, end)
            self.prefix_tier.store([keys[i] for i in new], [blocks[i].block_id for i in new])

    def release_out_of_window(self, req: Request) -> None:
        """Give back the leading blocks no query from position num_computed_tokens on can see: a query at
        p sees keys > p - window, so every key before num_computed_tokens - window + 1 is dead."""
        if self.sliding_window is None:
            return
        first_needed = req.num_computed_tokens - self.sliding_window + 1
        done = self._num_released.get(req.request_id, 0)
        dead = min(max(0, first_needed) // self.block_size, len(self._blocks.get(req.request_id, ())))
        if dead > done:
            self.pool.release(self._blocks[req.request_id][done:dead])
            self._num_released[req.request_id] = dead

    def free(self, req: Request) -> None:
        blocks = self._blocks.pop(req.request_id, [])
        released = self._num_released.pop(req.request_id, 0)
        self._num_registered.pop(req.request_id, None)
        self._filled_tokens.pop(req.request_id, None)
        self.pool.release(list(reversed(blocks[released:])))
