"""The ledger the engine logs at start and serves at /ledger: what the weights, the KV pool and, under tensor /
pipeline parallel, every rank took."""
from __future__ import annotations

from dataclasses import replace

import torch
import torch.distributed as dist

from tally.engine.config import EngineConfig
from tally.engine.parallel.distributed import ParallelContext
from tally.engine.speculation.draft_kv import window_tokens
from tally.engine.speculation.draft_model import DraftModel
from tally.engine.startup.path_tuning import PathChoice
from tally.ledger.kv import KVLayout
from tally.ledger.parallel import activation_buffer_bytes
from tally.ledger.report import EngineLedger
from tally.models.config import ModelConfig
from tally.models.pipeline_split import PPStage, plan_stages


def engine_ledger(config: EngineConfig, name: str, full_cfg: ModelConfig, weight_bytes: int, huge_page_bytes: int,
                  layout: KVLayout, num_blocks: int, max_model_len: int, path: PathChoice, draft: DraftModel | None,
                  stage: PPStage | None, parallel: ParallelContext | None) -> EngineLedger:
    ledger = EngineLedger(
        model_name=name,
        weight_bytes=weight_bytes,
        huge_page_bytes=huge_page_bytes,
        kv_blocks=num_blocks,
        block_size=config.block_size,
        kv_bytes_per_token=layout.bytes_per_token,
        kv_pool_bytes=num_blocks * layout.bytes_per_block,
        kv_dtype=layout.kv_dtype,
        reserve_bytes=0,
        max_model_len=max_model_len,
        max_num_seqs=config.max_num_seqs,
        path=path.to_dict(),
        draft={} if draft is None else {
            "model_name": draft.name, "weight_bytes": draft.weight_bytes,
            "kv_bytes_per_token": draft.layout.bytes_per_token, "kv_blocks": draft.num_blocks,
            "kv_pool_bytes": draft.num_blocks * draft.layout.bytes_per_block,
            "window_tokens": window_tokens(config.speculative.draft_context_tokens, config.block_size, max_model_len)},
    )
    if parallel is None:
        return ledger
    comm_bytes = activation_buffer_bytes(full_cfg, tp=config.tensor_parallel_size, pp=config.pipeline_parallel_size,
                                         max_batched_tokens=config.max_num_batched_tokens,
                                         activation_bytes=path.candidate.dtypes[0].itemsize,
                                         partial_sums=not config.batch_invariant)
    return replace(ledger, ranks=_gather_ranks(parallel, stage or plan_stages(full_cfg, 1)[0], weight_bytes,
                                               ledger.kv_pool_bytes, comm_bytes))


def _gather_ranks(parallel: ParallelContext, stage: PPStage, weight_bytes: int, kv_pool_bytes: int,
                  comm_buffer_bytes: int) -> list[dict]:
    """Every rank's own figures, for the ledger rank 0 shows. The communication tensors are made per step (gloo
    keeps no buffers of its own); comm_buffer_bytes is the largest step's, by the plan's rule."""
    mine = {"rank": parallel.env.rank, "weight_bytes": weight_bytes, "kv_pool_bytes": kv_pool_bytes,
            "comm_buffer_bytes": comm_buffer_bytes,
            "threads": torch.get_num_threads(), "stage": stage.stage, "layers": list(stage.layers)}
    ranks: list[dict | None] = [None] * parallel.env.world_size
    dist.all_gather_object(ranks, mine, group=parallel.control)
    return ranks
