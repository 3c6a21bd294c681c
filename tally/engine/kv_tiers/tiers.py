"""The KV tiers below the pool, built from the config in one place: the swap space for preemption
(tally/engine/kv_tiers/swap_space.py) and the disk prefix tier (tally/engine/kv_tiers/disk_prefix_cache.py), with what
the ledger says of them, and the copy of one pool block over another (an n>1 sibling takes its parent's last prompt
block so). All move every pool tensor of a block: the target's K and V (a draft model's KV, in a pool of its own,
never leaves it: a request back from a tier starts the draft afresh)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from tally.attention.kv_blocks import ExactBlocks, Int8Blocks, block_tensors, copy_block
from tally.engine.config import EngineConfig
from tally.engine.kv_tiers.disk_prefix_cache import WRITE_QUEUE_BYTES, DiskPrefixCache
from tally.engine.kv_tiers.identity import key_smoothing_scales, kv_identity
from tally.engine.kv_tiers.stats import DiskCacheStats, SwapStats
from tally.engine.kv_tiers.swap_space import SwapSpace
from tally.engine.startup.loaded_model import LoadedModel
from tally.models.registry import resolve_model
from tally.units import GiB


@dataclass
class KVTiers:
    swap: SwapSpace | None = None
    disk: DiskPrefixCache | None = None
    copy_block: Callable[[int, int], None] | None = None  # (src, dst) within the pool: n>1 siblings' prompt end

    def swap_stats(self) -> SwapStats | None:
        return self.swap.snapshot() if self.swap is not None else None

    def disk_stats(self) -> DiskCacheStats | None:
        return self.disk.snapshot() if self.disk is not None else None

    def ledger(self) -> dict:
        """What the tiers may take and what they measured at start-up, for EngineLedger.kv_tiers."""
        out: dict = {}
        if self.swap is not None:
            s = self.swap.snapshot()
            out["swap_space"] = {
                "capacity_bytes": s.capacity_bytes, "preemption_mode": self.swap.mode,
                "dtype": "int8" if isinstance(self.swap.codec, Int8Blocks) else "as stored",
                "bytes_per_block": self.swap.codec.nbytes,
                "out_s_per_block": s.out_s_per_block, "in_s_per_block": s.in_s_per_block}
        if self.disk is not None:
            d = self.disk.snapshot()
            out["disk_prefix_cache"] = {
                "dir": str(self.disk.dir), "capacity_bytes": d.capacity_bytes, "held_bytes_at_start": d.held_bytes,
                "files_at_start": d.num_files, "bytes_per_block": self.disk.codec.nbytes,
                "write_queue_bytes": WRITE_QUEUE_BYTES}
        return out

    def close(self) -> None:
        if self.disk is not None:
            self.disk.close()


def build_kv_tiers(config: EngineConfig, m: LoadedModel, recompute_seconds: Callable[[int], float | None]) -> KVTiers:
    """`recompute_seconds(tokens)`: the engine's measured price of prefilling that many tokens."""
    if config.world_size > 1:  # each rank's slice of the KV lives in its own process (EngineConfig refuses asking)
        return KVTiers()
    tensors = block_tensors(m.kv_caches)
    tiers = KVTiers(copy_block=partial(copy_block, tensors))
    if config.swap_space > 0 and config.preemption_mode != "recompute":
        lossy = config.swap_space_dtype == "int8" and all(t.is_floating_point() for t in tensors)
        tiers.swap = SwapSpace(Int8Blocks(tensors) if lossy else ExactBlocks(tensors), int(config.swap_space * GiB),
                               config.block_size, config.preemption_mode, recompute_seconds)
    if config.kv_disk_cache_dir is not None:
        codec = ExactBlocks(tensors)
        checkpoints = [resolve_model(config.model).path]
        scales = key_smoothing_scales(m.model)
        settings = {"path": m.ledger.path.get("path"), "many_tokens_from": m.ledger.path.get("many_tokens_from"),
                    "blocks": codec.layout}
        tiers.disk = DiskPrefixCache(config.kv_disk_cache_dir, int(config.kv_disk_cache_size * GiB),
                                     kv_identity(checkpoints, settings, scales), codec, config.block_size)
    return tiers
