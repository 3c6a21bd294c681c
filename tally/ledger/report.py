"""The engine's own ledger: what it really allocated at start-up, in the plan's units, for the
start-up log and GET /ledger (the server adds the live fields: used and cached blocks)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from tally.units import fmt_gb, fmt_gib, fmt_small_bytes


@dataclass(frozen=True)
class EngineLedger:
    model_name: str
    weight_bytes: int
    kv_blocks: int
    block_size: int  # tokens per block
    kv_bytes_per_token: int
    kv_pool_bytes: int
    reserve_bytes: int
    max_model_len: int
    max_num_seqs: int
    # how the projections run and why (tally/engine/startup/path_tuning.py PathChoice.to_dict); empty when not known
    path: dict = field(default_factory=dict)
    # tensor / pipeline parallel: each rank's own {rank, stage, layers: [first, end), weight_bytes, kv_pool_bytes,
    # comm_buffer_bytes, threads}; the fields above are rank 0's
    ranks: list[dict] = field(default_factory=list)
    # speculative decoding's draft model: {model_name, weight_bytes, kv_bytes_per_token, kv_blocks, kv_pool_bytes,
    # window_tokens}: its KV in a pool of its own (the fields above are the target's), each request it drafts for
    # holding at most window_tokens of it; empty without one
    draft: dict = field(default_factory=dict)
    # the KV tiers below the pool (tally/engine/kv_tiers/tiers.py KVTiers.ledger): "swap_space" {capacity_bytes,
    # preemption_mode, dtype, bytes_per_block, out_s_per_block, in_s_per_block} and "disk_prefix_cache" {dir,
    # capacity_bytes, held_bytes_at_start, files_at_start, bytes_per_block, write_queue_bytes}; each only when on
    kv_tiers: dict = field(default_factory=dict)
    kv_dtype: str = ""  # the cache's values (tally/ledger/kv.py names): float32, float16, bfloat16, int8
    # LoRA adapters (tally/engine/lora_manager.py): {max_cpu_loras, max_lora_rank, max_loras, capacity_bytes: what
    # max_cpu_loras adapters of max_lora_rank targeting every projection take}; empty without --enable-lora
    lora: dict = field(default_factory=dict)
    huge_page_bytes: int = 0  # of weight_bytes, those in the arena advised for huge pages (tally/layers/huge_pages.py)

    @property
    def kv_tokens(self) -> int:
        return self.kv_blocks * self.block_size

    @property
    def max_concurrency_at_max_len(self) -> int:
        """Requests of max_model_len tokens the pool holds at once, in whole blocks."""
        blocks_per_request = -(-self.max_model_len // self.block_size)
        return self.kv_blocks // max(blocks_per_request, 1)

    def format(self) -> str:
        lines = [
            f"ledger: {self.model_name}: weights {fmt_gib(self.weight_bytes)} ({fmt_gb(self.weight_bytes)}"
            + (f", {fmt_gib(self.huge_page_bytes)} of them on huge pages" if self.huge_page_bytes else "")
            + f"), reserve {fmt_gib(self.reserve_bytes)}",
            f"ledger: KV pool {fmt_gib(self.kv_pool_bytes)} = {self.kv_blocks:,} blocks x {self.block_size} tokens = "
            f"{self.kv_tokens:,} tokens at {fmt_small_bytes(self.kv_bytes_per_token)} per token"
            + (f" ({self.kv_dtype})" if self.kv_dtype else ""),
            f"ledger: {self.max_concurrency_at_max_len:,} request(s) of max_model_len {self.max_model_len:,} fit at "
            f"once (max_num_seqs {self.max_num_seqs:,})",
        ]
        if self.path:
            lines.append(f"ledger: projections {self.path['summary']}")
        if self.draft:
            d = self.draft
            lines.append(f"ledger: draft model {d['model_name']}: weights {fmt_gib(d['weight_bytes'])} "
                         f"({fmt_gb(d['weight_bytes'])}); its own KV pool {fmt_gib(d['kv_pool_bytes'])} = "
                         f"{d['kv_blocks']:,} blocks at {fmt_small_bytes(d['kv_bytes_per_token'])} per token, up to "
                         f"{d['window_tokens']:,} tokens a request it drafts for")
        lines += self._kv_tier_lines()
        if self.lora:
            lora = self.lora
            lines.append(f"ledger: LoRA adapters up to {fmt_gib(lora['capacity_bytes'])}: {lora['max_cpu_loras']} "
                         f"held in memory at rank ≤ {lora['max_lora_rank']}, {lora['max_loras']} per step")
        for r in self.ranks:
            first, end = r["layers"]
            lines.append(f"ledger: rank {r['rank']}: stage {r['stage']} (layers {first}-{end - 1}), weights "
                         f"{fmt_gib(r['weight_bytes'])}, KV pool {fmt_gib(r['kv_pool_bytes'])}, communication "
                         f"buffers {fmt_gib(r['comm_buffer_bytes'])}, "
                         f"{r['threads']} thread(s)")
        if self.max_concurrency_at_max_len < self.max_num_seqs:
            lines.append(f"ledger: max_num_seqs {self.max_num_seqs:,} x max_model_len {self.max_model_len:,} exceeds "
                         "the KV pool: long requests will queue or be preempted")
        return "\n".join(lines)

    def _kv_tier_lines(self) -> list[str]:
        lines = []
        swap = self.kv_tiers.get("swap_space")
        if swap:
            round_trip_ms = (swap["out_s_per_block"] + swap["in_s_per_block"]) * 1e3
            lines.append(f"ledger: swap space up to {fmt_gib(swap['capacity_bytes'])} beside the pool, taken only "
                         f"while preempted requests wait; blocks {swap['dtype']}, "
                         f"{fmt_small_bytes(swap['bytes_per_block'])} each, out and back measured {round_trip_ms:.3f} "
                         f"ms per block (preemption {swap['preemption_mode']})")
        disk = self.kv_tiers.get("disk_prefix_cache")
        if disk:
            lines.append(f"ledger: disk prefix cache {disk['dir']}: {fmt_gib(disk['held_bytes_at_start'])} of "
                         f"{fmt_gib(disk['capacity_bytes'])} in use at start ({disk['files_at_start']:,} blocks, every "
                         f"model's), {fmt_small_bytes(disk['bytes_per_block'])} per block; up to "
                         f"{fmt_small_bytes(disk['write_queue_bytes'])} of RAM for blocks waiting to be written")
        return lines

    def to_dict(self) -> dict:
        return {**asdict(self), "kv_tokens": self.kv_tokens,
                "max_concurrency_at_max_len": self.max_concurrency_at_max_len}
