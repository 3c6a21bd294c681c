"""A fixed pool of KV blocks: ref counts, a free list, and an LRU of free blocks that still hold a
cached prefix (evicted only when no plain free block is left)."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None  # set once the block is full and registered in the prefix cache
    token_ids: tuple[int, ...] = ()  # kept with the hash to rule out collisions on a hit


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free_plain: list[int] = list(range(num_blocks - 1, -1, -1))  # stack, low ids first
        self._free_cached: OrderedDict[int, None] = OrderedDict()  # LRU: oldest first
        self._by_hash: dict[int, int] = {}

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_plain) + len(self._free_cached)

    @property
    def num_cached_free_blocks(self) -> int:
        return len(self._free_cached)

    def allocate(self, n: int) -> list[Block]:
        """n fresh blocks (ref count 1); the caller checked num_free_blocks."""
        out = []
        for _ in range(n):
            if self._free_plain:
                block = self.blocks[self._free_plain.pop()]
            else:
                block_id, _ = self._free_cached.popitem(last=False)
                block = self.blocks[block_id]
                del self._by_hash[block.block_hash]
                block.block_hash, block.token_ids = None, ()
            block.ref_count = 1
            out.append(block)
        return out

    def lookup(self, block_hash: int, token_ids: tuple[int, ...]) -> Block | None:
        block_id = self._by_hash.get(block_hash)
        if block_id is None:
            return None
        block = self.blocks[block_id]
        return block if block.token_ids == token_ids else None

    def touch(self, block: Block) -> None:
        """Take one more reference to a cached block (a prefix hit)."""
        if block.ref_count == 0:
            del self._free_cached[block.block_id]
        block.ref_count += 1

    def register(self, block: Block, block_hash: int, token_ids: tuple[int, ...]) -> bool:
        """Make a full block findable by its chained hash (first writer wins); whether this block became it."""
        if block.block_hash is not None or block_hash in self._by_hash:
            return False
        block.block_hash, block.token_ids = block_hash, token_ids
        self._by_hash[block_hash] = block.block_id
        return True

    def release(self, blocks: list[Block]) -> None:
        """Drop one reference from each; pass blocks tail first so tails are evicted first."""
        for block in blocks:
            block.ref_count -= 1
            assert block.ref_count >= 0, f"block {block.block_id} ref count went negative"
            if block.ref_count == 0:
                if block.block_hash is None:
                    self._free_plain.append(block.block_id)
                else:
                    self._free_cached[block.block_id] = None
