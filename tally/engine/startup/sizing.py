"""The KV pool: its dtype, how many blocks the budget holds (with a draft model, the draft's own pool beside the
target's), and the tensors themselves."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from tally.attention.kv_cache import Int8KVCache, KVCache
from tally.engine.config import EngineConfig
from tally.engine.parallel.distributed import ParallelContext
from tally.engine.speculation.draft_kv import budget_share, draft_slots, window_tokens
from tally.engine.speculation.draft_model import DraftModel
from tally.engine.startup.placing import agreed
from tally.errors import ConfigError
from tally.ledger.kv import KVLayout, auto_kv_dtype
from tally.models.config import ModelConfig
from tally.models.key_smoothing import calibration_ids, measure_key_scales
from tally.models.decoder import CausalLM
from tally.models.pipeline_split import PPStage
from tally.platform import available_ram_bytes

if TYPE_CHECKING:
    from tally.models.tokenizer import Tokenizer

DEFAULT_KV_CAP_BYTES = 2 * 2**30
_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}


def kv_dtype(config: EngineConfig, dtype: torch.dtype, quantized: bool, model: CausalLM, tokenizer: Tokenizer) -> str:
    """--kv-cache-dtype, or the ledger's choice for this model; an int8 cache measures its key smoothing here."""
    name = auto_kv_dtype(_DTYPE_NAMES[dtype], quantized) if config.kv_cache_dtype == "auto" else config.kv_cache_dtype
    if name == "int8":
        model.set_key_smoothing(measure_key_scales(model, calibration_ids(tokenizer)))
    return name


def kv_layout(config: EngineConfig, cfg: ModelConfig, kv_dtype_name: str, stage: PPStage | None) -> KVLayout:
    """This stage's layers only; stage 0 holds the most, so the block count rank 0 sizes fits every stage."""
    return KVLayout.for_model(replace(cfg, num_layers=stage.num_layers) if stage is not None else cfg,
                              kv_dtype=kv_dtype_name, block_size=config.block_size)


def pool_blocks(config: EngineConfig, layout: KVLayout, draft: DraftModel | None, max_model_len: int,
                parallel: ParallelContext | None) -> tuple[int, int]:
    """Blocks the KV budget holds: the target's pool's and a draft model's own (0 without one). A ConfigError where
    the target's holds less than one request of max_model_len, or the draft's less than one request's window."""
    request_bytes = layout.blocks_for_tokens(max_model_len) * layout.bytes_per_block  # one max_model_len request
    window_blocks = draft_wanted = 0
    if draft is not None:  # its windows for the requests it drafts for at once: what its pool can ever use
        spec = config.speculative
        window_blocks = draft.layout.blocks_for_tokens(
            window_tokens(spec.draft_context_tokens, config.block_size, max_model_len))
        draft_wanted = draft_slots(config.max_num_seqs, spec.adaptive) * window_blocks
    budget = config.kv_cache_memory
    if budget is None:
        # Like vLLM's CPU backend, a bounded default: zero-filling a pool costs ~2 s per GB here, and
        # a pool larger than max_num_seqs full-length requests can never be used.
        useful = config.max_num_seqs * request_bytes + draft_wanted * (draft.layout.bytes_per_block if draft else 0)
        budget = min(int(available_ram_bytes() * config.kv_cache_memory_fraction), DEFAULT_KV_CAP_BYTES, useful)
    draft_blocks = 0
    if draft is not None:
        share = budget_share(layout.bytes_per_block, draft.layout.bytes_per_block, config.speculative.adaptive)
        draft_blocks = min(draft_wanted, int(max(budget, 0) * share) // draft.layout.bytes_per_block)
    draft_bytes = draft_blocks * (draft.layout.bytes_per_block if draft is not None else 0)
    num_blocks = config.num_gpu_blocks_override or agreed(
        parallel, lambda: max(budget - draft_bytes, 0) // layout.bytes_per_block)  # rank 0 holds the most heads
    if config.num_gpu_blocks_override and draft is not None:
        draft_blocks = min(draft_wanted, num_blocks)
    if num_blocks * config.block_size < max_model_len:
        drafts = f" (the draft model {draft.name}'s own pool takes {draft_bytes:,} of them)" if draft else ""
        raise ConfigError(
            f"the KV cache budget ({budget:,} bytes{drafts}) holds {num_blocks * config.block_size:,} tokens, fewer "
            f"than one request of max_model_len {max_model_len:,}; raise --kv-cache-memory to ≥ "
            f"{_budget_for(request_bytes, draft_wanted, draft, share if draft else 0.0):,} or lower --max-model-len")
    if draft is not None and draft_blocks < window_blocks:
        raise ConfigError(
            f"the KV cache budget ({budget:,} bytes) leaves the draft model {draft.name} {draft_blocks:,} blocks, "
            f"fewer than the {window_blocks:,} of one request's draft window (draft_context_tokens "
            f"{config.speculative.draft_context_tokens}, 0: the whole context); raise --kv-cache-memory or lower "
            "draft_context_tokens")
    return num_blocks, draft_blocks


def _budget_for(request_bytes: int, draft_wanted: int, draft: DraftModel | None, share: float) -> int:
    """The least budget that leaves the target one max_model_len request beside the draft's pool, which takes
    `share` of the budget up to its `draft_wanted` blocks (a block more, for the pools' whole blocks)."""
    if draft is None:
        return request_bytes
    per_block = draft.layout.bytes_per_block
    budget = math.ceil(request_bytes / (1 - share)) + per_block
    return budget if budget * share <= draft_wanted * per_block else request_bytes + (draft_wanted + 1) * per_block


def allocate_kv(cfg: ModelConfig, layout: KVLayout, num_blocks: int) -> list[tuple[KVCache, KVCache]]:
    """One pool for all layers, K and V, sized exactly num_blocks * layout.bytes_per_block; int8
    adds the ledger's float32 scale per (layer, K/V, token slot, KV head) beside the values."""
    shape = (layout.num_layers, 2, num_blocks, layout.block_size, cfg.num_kv_heads, cfg.head_dim)
    if layout.kv_dtype == "int8":
        values = torch.zeros(shape, dtype=torch.int8)
        scales = torch.zeros(shape[:5], dtype=torch.float32)
        return [(Int8KVCache(values[i, 0], scales[i, 0]), Int8KVCache(values[i, 1], scales[i, 1]))
                for i in range(layout.num_layers)]
    cache_dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[layout.kv_dtype]
    pool = torch.zeros(shape, dtype=cache_dtype)
    return [(pool[i, 0], pool[i, 1]) for i in range(layout.num_layers)]
