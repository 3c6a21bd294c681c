"""Start-up, phase by phase: place the threads, read the checkpoint, measure the path, build the model, size the KV
pool, write the ledger. Under tensor / pipeline parallelism every rank runs it for its own slice."""
from __future__ import annotations

import logging

import torch

from tally.engine.config import EngineConfig
from tally.engine.parallel.distributed import ParallelContext, join
from tally.engine.pooling import pooler_config, serving_runner
from tally.engine.speculation.draft_model import load_draft, model_weight_bytes
from tally.engine.startup.engine_ledger import engine_ledger
from tally.engine.startup.loaded_model import LoadedModel
from tally.engine.startup.loading import build_target, context_length
from tally.engine.startup.path_tuning import measured_path
from tally.engine.startup.placing import agreed, place_threads
from tally.engine.startup.sizing import allocate_kv, kv_dtype, kv_layout, pool_blocks
from tally.models.generation_config import sampling_defaults
from tally.models.loader import Checkpoint, load_checkpoint
from tally.models.pipeline_split import PPStage, plan_stages
from tally.models.sentence_transformers import checkpoint_pooling
from tally.models.tensor_parallel import TPShard, plan_shards
from tally.models.tokenizer import load_tokenizer, stop_token_ids
from tally.native import ops as native

log = logging.getLogger(__name__)


def load_model(config: EngineConfig) -> LoadedModel:
    """This process's model and KV pool; under tensor / pipeline parallelism, this rank's slice of them (every rank
    runs this function; rank 0's measured path and KV pool size are the ones all use)."""
    torch.manual_seed(config.seed)
    caveat = batch_invariance_caveat(config)
    if caveat:
        log.warning(caveat)
    ckpt = load_checkpoint(config.model)
    if config.world_size == 1:
        return _load(config, ckpt, None, None, None)
    tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
    # a split that cannot work is refused before any process starts
    shards = plan_shards(ckpt.config, tp, partial_sums=not config.batch_invariant) if tp > 1 else None
    stages = plan_stages(ckpt.config, pp) if pp > 1 else None
    parallel = join(config)
    rank = parallel.env.rank
    try:
        return _load(config, ckpt, shards[rank % tp] if shards else None, stages[rank // tp] if stages else None,
                     parallel)
    except BaseException:
        parallel.abort()  # no rank may be left waiting for a model that will never run
        raise


def batch_invariance_caveat(config: EngineConfig) -> str | None:
    """Why batch_invariant cannot hold here, or None: without the native kernels projections run on PyTorch's
    BLAS, whose sums follow the row count (docs/server.md#reproducibility)."""
    if not config.batch_invariant or native.available():
        return None
    return ("batch_invariant is on but the native kernels are off (TALLY_NATIVE=0, or no AVX2: see the log above); "
            "PyTorch's matmul sums in an order that depends on the batch's row count, so a request's logits may change "
            "with what runs beside it (docs/server.md#reproducibility)")


def _load(config: EngineConfig, ckpt: Checkpoint, shard: TPShard | None, stage: PPStage | None,
          parallel: ParallelContext | None) -> LoadedModel:
    full_cfg = ckpt.config
    cfg = shard.local_config(full_cfg) if shard is not None else full_cfg
    place_threads(config, parallel)
    tokenizer = load_tokenizer(ckpt)
    path = agreed(parallel, lambda: measured_path(config, ckpt))
    dtype, weight_dtype = path.candidate.dtypes
    max_model_len = context_length(config, cfg)
    model = build_target(config, ckpt, cfg, path, max_model_len, shard, stage, parallel)
    kv_dtype_name = kv_dtype(config, dtype, path.candidate.quantization is not None, model, tokenizer)
    layout = kv_layout(config, cfg, kv_dtype_name, stage)
    draft = None
    if config.speculative is not None and config.speculative.method == "draft_model":
        draft = load_draft(config, full_cfg, tokenizer, dtype, weight_dtype, max_model_len, kv_dtype_name,
                           path.many_tokens_from)
    num_blocks, draft_blocks = pool_blocks(config, layout, draft, max_model_len, parallel)
    kv_caches = allocate_kv(cfg, layout, num_blocks)
    if draft is not None:  # its own pool, for the windows of the requests it drafts for
        draft.num_blocks, draft.kv_caches = draft_blocks, allocate_kv(draft.config, draft.layout, draft_blocks)
    name = (config.served_model_names or (ckpt.name,))[0]
    declared = checkpoint_pooling(ckpt.path)
    runner = serving_runner(config.runner, config.convert, config.task, declared)
    ledger = engine_ledger(config, name, full_cfg, model_weight_bytes(model), model.huge_page_bytes, layout,
                           num_blocks, max_model_len, path, draft, stage, parallel)
    return LoadedModel(
        name=name, config=full_cfg, tokenizer=tokenizer, stop_token_ids=stop_token_ids(tokenizer, full_cfg),
        model=model, kv_caches=kv_caches, kv_layout=layout, num_blocks=num_blocks, max_model_len=max_model_len,
        ledger=ledger, parallel=parallel, draft=draft,
        supported_tasks=("embed",) if runner == "pooling" else ("generate",),
        pooler=pooler_config(config.pooler_config, declared, runner == "pooling"),
        sampling_defaults=sampling_defaults(config.generation_config, ckpt.path, config.override_generation_config))
