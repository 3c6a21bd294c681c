"""What start-up hands the engine: the model, its tokenizer, the KV pool and the ledger of what they took."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tally.attention.kv_cache import KVCache
from tally.engine.parallel.distributed import ParallelContext
from tally.engine.pooling import PoolerConfig
from tally.engine.speculation.draft_model import DraftModel
from tally.ledger.kv import KVLayout
from tally.ledger.report import EngineLedger
from tally.models.config import ModelConfig
from tally.models.decoder import CausalLM

if TYPE_CHECKING:
    from tally.models.tokenizer import Tokenizer


@dataclass
class LoadedModel:
    name: str
    config: ModelConfig
    tokenizer: Tokenizer
    stop_token_ids: tuple[int, ...]
    model: CausalLM
    kv_caches: list[tuple[KVCache, KVCache]]
    kv_layout: KVLayout
    num_blocks: int
    max_model_len: int
    ledger: EngineLedger
    sampling_defaults: dict[str, float]  # from generation_config.json (--generation-config)
    supported_tasks: tuple[str, ...]  # ("generate",) or ("embed",): --runner, else what the checkpoint is
    pooler: PoolerConfig  # how embeddings are pooled (the checkpoint's, under --pooler-config)
    parallel: ParallelContext | None = None  # tensor / pipeline parallel: this process's rank and its groups
    draft: DraftModel | None = None  # speculative decoding's draft model; its KV in the same pool blocks
