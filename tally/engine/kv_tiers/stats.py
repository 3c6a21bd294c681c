"""The counters of the KV tiers below the pool (tally/engine/kv_tiers/swap_space.py,
tally/engine/kv_tiers/disk_prefix_cache.py), as the engine's snapshot carries them to /metrics and /ledger."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SwapStats:
    capacity_bytes: int
    held_bytes: int = 0
    num_requests: int = 0  # preempted requests whose blocks wait in the swap space
    swapped_out_blocks: int = 0
    swapped_in_blocks: int = 0
    num_swapped: int = 0  # preemptions that swapped (the others recomputed)
    # measured seconds per block: copying out (at preemption) and back (at resumption)
    out_s_per_block: float = 0.0
    in_s_per_block: float = 0.0
    # the last preemption's estimates: copying its blocks out and back vs recomputing them (None: not estimated)
    last_swap_s: float | None = None
    last_recompute_s: float | None = None

    @property
    def usage(self) -> float:
        return self.held_bytes / self.capacity_bytes if self.capacity_bytes else 0.0


@dataclass
class DiskCacheStats:
    capacity_bytes: int
    held_bytes: int = 0  # every tier file in the directory, whichever model wrote it
    num_files: int = 0
    queried_tokens: int = 0  # tokens of the blocks looked up after the pool missed (up to the tier's first miss)
    hit_tokens: int = 0  # tokens read back from it
    written_blocks: int = 0
    dropped_writes: int = 0  # blocks not written because the write queue was full
    damaged_files: int = 0  # files that failed their check when read (deleted: a miss, never a wrong block)
    write_errors: int = 0
