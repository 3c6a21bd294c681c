"""KV storage below the block pool, as the scheduler and the block tables see it (no torch: the engine's
tally/engine/kv_tiers/swap_space.py and tally/engine/kv_tiers/disk_prefix_cache.py move the bytes).

Two tiers:
- a swap space, where a preempted request's blocks wait instead of being recomputed (vLLM's swap preemption);
- a prefix tier, where full blocks are kept by a name that is stable across processes (`extend_block_keys`), so
  a prompt prefix seen by an earlier `tally serve` is a prefix hit after a restart. The pool's own block hashes
  cannot serve: Python salts the hash of a string (the cache salt) per process."""
from __future__ import annotations

import hashlib
from array import array
from typing import Protocol

from tally.core.request import Request


class SwapTier(Protocol):
    def swap_out(self, req: Request, block_ids: list[int]) -> bool:
        """Keep a copy of the blocks holding req's computed tokens (its table's first entries) if that is measured
        cheaper than recomputing them and there is room; False: nothing kept, the request will recompute."""

    def swapped_tokens(self, request_id: str) -> int:
        """Leading tokens of the request whose KV the tier holds (0: none); never all its tokens: the last one's
        logits are needed."""

    def swap_in(self, request_id: str, block_ids: list[int]) -> None:
        """Copy the held blocks into the first blocks of this table and forget them."""

    def discard(self, request_id: str) -> None:
        """Forget what the tier holds of the request (it ended while preempted)."""


class PrefixTier(Protocol):
    def holds(self, key: bytes) -> bool:
        """Whether the tier has the full block of this name."""

    def load(self, keys: list[bytes], block_ids: list[int]) -> int:
        """Read the blocks of these names into these pool blocks; how many leading ones were read whole (a missing
        or damaged one ends the run)."""

    def store(self, keys: list[bytes], block_ids: list[int]) -> None:
        """Full blocks of computed tokens, just registered in the prefix cache: keep them under these names."""


def extend_block_keys(req: Request, block_size: int, num_blocks: int) -> list[bytes]:
    """req.block_keys, computed up to its first num_blocks full blocks: a chain like the block hashes (the block's
    tokens and its parent's key; the cache salt and LoRA adapter in the first), by blake2b, so the same tokens get the
    same names in every process."""
    keys = req.block_keys
    for i in range(len(keys), num_blocks):
        h = hashlib.blake2b(keys[-1] if keys else _chain_start(req), digest_size=16)
        h.update(array("q", req.token_ids[i * block_size:(i + 1) * block_size]).tobytes())
        keys.append(h.digest())
    return keys


def _chain_start(req: Request) -> bytes:
    salt = repr(req.cache_salt).encode()
    return salt if req.lora_key is None else salt + b"|lora:" + req.lora_key.encode()
