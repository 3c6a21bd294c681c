"""Start-up: checkpoint → model → KV pool sized by the ledger → the ledger the engine logs."""
from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from tally.attention.backend import make_backend
from tally.attention.kv_cache import Int8KVCache, KVCache
from tally.engine.config import EngineConfig
from tally.engine.distributed import ParallelContext, allowed_cpus, join, rank_cpus
from tally.engine.draft_model import DraftModel, load_draft, model_weight_bytes
from tally.engine.path_tuning import PathChoice, choose_path
from tally.errors import ConfigError
from tally.layers.path_timing import use_bf16_many_tokens
from tally.ledger.kv import KVLayout, auto_kv_dtype
from tally.ledger.parallel import activation_buffer_bytes
from tally.ledger.report import EngineLedger
from tally.models.builder import build_model
from tally.models.config import ModelConfig
from tally.models.generation_config import sampling_defaults
from tally.models.key_smoothing import calibration_ids, measure_key_scales
from tally.models.llama import CausalLM
from tally.models.loader import Checkpoint, load_checkpoint
from tally.models.pipeline_split import PPStage, plan_stages
from tally.models.projection_shapes import projection_shapes
from tally.models.tensor_parallel import TPShard, plan_shards
from tally.models.tokenizer import load_tokenizer, stop_token_ids
from tally.platform import available_ram_bytes, parse_cpu_list, physical_cores, pin_process

log = logging.getLogger("tally.engine")
T = TypeVar("T")
DEFAULT_KV_CAP_BYTES = 2 * 2**30
_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}


@dataclass
class LoadedModel:
    name: str
    config: ModelConfig
    tokenizer: Any
    stop_token_ids: tuple[int, ...]
    model: CausalLM
    kv_caches: list[tuple[KVCache, KVCache]]
    kv_layout: KVLayout
    num_blocks: int
    max_model_len: int
    ledger: EngineLedger
    sampling_defaults: dict[str, float]  # from generation_config.json (--generation-config)
    parallel: ParallelContext | None = None  # tensor / pipeline parallel: this process's rank and its groups
    draft: DraftModel | None = None  # speculative decoding's draft model; its KV in the same pool blocks


def load_model(config: EngineConfig) -> LoadedModel:
    """This process's model and KV pool; under tensor / pipeline parallelism, this rank's slice of them (every rank
    runs this function; rank 0's measured path and KV pool size are the ones all use)."""
    torch.manual_seed(config.seed)
    ckpt = load_checkpoint(config.model)
    if config.world_size == 1:
        return _load(config, ckpt, None, None, None)
    tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
    # a split that cannot work is refused before any process starts
    shards = plan_shards(ckpt.config, tp) if tp > 1 else None
    stages = plan_stages(ckpt.config, pp) if pp > 1 else None
    parallel = join(config)
    rank = parallel.env.rank
    try:
        return _load(config, ckpt, shards[rank % tp] if shards else None, stages[rank // tp] if stages else None,
                     parallel)
    except BaseException:
        parallel.abort()  # no rank may be left waiting for a model that will never run
        raise


def _load(config: EngineConfig, ckpt: Checkpoint, shard: TPShard | None, stage: PPStage | None,
          parallel: ParallelContext | None) -> LoadedModel:
    full_cfg = ckpt.config
    cfg = shard.local_config(full_cfg) if shard is not None else full_cfg
    _place_threads(config, parallel)
    tokenizer = load_tokenizer(ckpt)
    path = _agreed(parallel, lambda: measured_path(config, ckpt))
    dtype, weight_dtype = path.candidate.dtypes
    max_model_len = config.max_model_len or cfg.max_position_embeddings
    if max_model_len > cfg.max_position_embeddings:
        raise ConfigError(
            f"max_model_len {max_model_len:,} exceeds the model's context length "
            f"{cfg.max_position_embeddings:,}; use --max-model-len ≤ {cfg.max_position_embeddings}")
    # Attention computes in the model's dtype, as transformers does (SDPA accumulates in fp32 inside): in bf16,
    # converting each layer's context to fp32 first took ~40 ms of a 190 ms step holding a prompt chunk at
    # context 3,000 beside 6 decodes (torch profiler, the built-in model).
    attn = make_backend(
        config.attention_backend,
        num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
        scale=cfg.head_dim ** -0.5, sliding_window=cfg.sliding_window, compute_dtype=dtype,
    )
    # Each tensor is cut to this rank's slice as it is read, and a stage reads only its own: no rank ever holds the
    # whole model.
    progress = config.load_progress(parallel.env.rank if parallel is not None else 0)
    tensors = {n: shard.shard(n, t) if shard is not None else t for n, t in ckpt.tensors(progress)
               if stage is None or stage.holds(n)}
    model = build_model(cfg, tensors, dtype=dtype, quantization=path.candidate.quantization,
                        attn=attn, max_model_len=max_model_len, checkpoint=ckpt, weight_dtype=weight_dtype,
                        parallel=(shard, parallel.tp) if shard is not None else None, stage=stage)
    if path.many_tokens_from is not None:
        use_bf16_many_tokens(list(model.modules()), path.many_tokens_from)
    weight_bytes = model_weight_bytes(model)

    kv_dtype_name = (auto_kv_dtype(_DTYPE_NAMES[dtype], path.candidate.quantization is not None)
                     if config.kv_cache_dtype == "auto" else config.kv_cache_dtype)
    if kv_dtype_name == "int8":
        model.set_key_smoothing(measure_key_scales(model, calibration_ids(tokenizer)))
    # this stage's layers only; stage 0 holds the most, so the block count rank 0 sizes fits every stage
    layout = KVLayout.for_model(replace(cfg, num_layers=stage.num_layers) if stage is not None else cfg,
                                kv_dtype=kv_dtype_name, block_size=config.block_size)
    spec = config.speculative
    draft = None
    if spec is not None and spec.method == "draft_model":
        draft = load_draft(config, full_cfg, tokenizer, dtype, weight_dtype, max_model_len, kv_dtype_name,
                           path.many_tokens_from)
    # A block holds its tokens' KV for the target and, with a draft model, for the draft too: one pool, one budget.
    bytes_per_block = layout.bytes_per_block + (draft.layout.bytes_per_block if draft is not None else 0)
    bytes_per_token = layout.bytes_per_token + (draft.layout.bytes_per_token if draft is not None else 0)
    request_bytes = layout.blocks_for_tokens(max_model_len) * bytes_per_block  # one max_model_len request
    budget = config.kv_cache_memory
    if budget is None:
        # Like vLLM's CPU backend, a bounded default: zero-filling a pool costs ~2 s per GB here, and
        # a pool larger than max_num_seqs full-length requests can never be used.
        useful = config.max_num_seqs * request_bytes
        budget = min(int(available_ram_bytes() * config.kv_cache_memory_fraction), DEFAULT_KV_CAP_BYTES, useful)
    num_blocks = config.num_gpu_blocks_override or _agreed(
        parallel, lambda: max(budget, 0) // bytes_per_block)  # rank 0 holds the most heads
    if num_blocks * config.block_size < max_model_len:
        drafts = (f" (the draft model {draft.name} takes {draft.layout.bytes_per_token:,} of its "
                  f"{bytes_per_token:,} bytes per token)" if draft is not None else "")
        raise ConfigError(
            f"the KV cache budget ({budget:,} bytes) holds {num_blocks * config.block_size:,} tokens{drafts}, fewer "
            f"than one request of max_model_len {max_model_len:,}; raise --kv-cache-memory to ≥ "
            f"{request_bytes:,} or lower --max-model-len")
    kv_caches = _allocate_kv(cfg, layout, num_blocks, dtype)
    if draft is not None:
        draft.kv_caches = _allocate_kv(draft.config, draft.layout, num_blocks, dtype)
    ledger = EngineLedger(
        model_name=(config.served_model_names or (ckpt.name,))[0],
        weight_bytes=weight_bytes,
        huge_page_bytes=model.huge_page_bytes,
        kv_blocks=num_blocks,
        block_size=config.block_size,
        kv_bytes_per_token=bytes_per_token,
        kv_pool_bytes=num_blocks * bytes_per_block,
        kv_dtype=layout.kv_dtype,
        reserve_bytes=0,
        max_model_len=max_model_len,
        max_num_seqs=config.max_num_seqs,
        path=path.to_dict(),
        draft={} if draft is None else {"model_name": draft.name, "weight_bytes": draft.weight_bytes,
                                        "kv_bytes_per_token": draft.layout.bytes_per_token},
    )
    if parallel is not None:
        comm_bytes = activation_buffer_bytes(full_cfg, tp=config.tensor_parallel_size, pp=config.pipeline_parallel_size,
                                             max_batched_tokens=config.max_num_batched_tokens,
                                             activation_bytes=dtype.itemsize)
        ledger = replace(ledger, ranks=_gather_ranks(parallel, stage or plan_stages(full_cfg, 1)[0], weight_bytes,
                                                         ledger.kv_pool_bytes, comm_bytes))
    return LoadedModel(
        name=(config.served_model_names or (ckpt.name,))[0], config=full_cfg, tokenizer=tokenizer,
        stop_token_ids=stop_token_ids(tokenizer, full_cfg), model=model, kv_caches=kv_caches, kv_layout=layout,
        num_blocks=num_blocks, max_model_len=max_model_len, ledger=ledger,
        sampling_defaults=sampling_defaults(config.generation_config, ckpt.path), parallel=parallel, draft=draft)


def _place_threads(config: EngineConfig, parallel: ParallelContext | None) -> None:
    """Threads = physical cores of the CPUs this process runs on. Ranks sharing a machine each get a disjoint
    share of its CPUs (tally/engine/distributed.py:rank_cpus); a single process is pinned only when asked."""
    if parallel is None:
        if config.cpu_affinity is not None:
            pin_process(parse_cpu_list(config.cpu_affinity))
        torch.set_num_threads(config.threads or physical_cores())
        return
    allowed = allowed_cpus(config)
    cpus = rank_cpus(parallel.env, allowed)
    parallel.saved_placement = (os.sched_getaffinity(0), torch.get_num_threads())
    pin_process(cpus)
    torch.set_num_threads(config.threads or physical_cores())
    advice = ""
    if parallel.env.local_world_size > len(allowed):
        advice = (f"; {parallel.env.local_world_size} ranks share {len(allowed)} CPU(s) here and will wait on each "
                  "other: run at most one rank per core")
    log.info("rank %d of %d: %d thread(s) on CPUs %s%s", parallel.env.rank, parallel.env.world_size,
             torch.get_num_threads(), ",".join(map(str, sorted(cpus))), advice)


def _agreed(parallel: ParallelContext | None, decide: Callable[[], T]) -> T:
    """decide() on rank 0, the same value on every rank (a path measured on one CPU set, one KV pool size)."""
    if parallel is None:
        return decide()
    box = [decide() if parallel.env.rank == 0 else None]
    dist.broadcast_object_list(box, src=0, group=parallel.control)
    return box[0]


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


def measured_path(config: EngineConfig, ckpt: Checkpoint, *, remeasure: bool = False) -> PathChoice:
    """The projection path for this checkpoint and config: fixed by flags, or measured here (and cached)."""
    candidates, open_choice = config.path_candidates(ckpt.config.torch_dtype, ckpt.format == "gguf",
                                                     ckpt.quantization is not None)
    if not open_choice:
        return PathChoice(candidates[0])
    shapes = {c.quantization or "": projection_shapes(ckpt.config, c.quantization, ckpt) for c in candidates}
    return choose_path(candidates, shapes, remeasure=remeasure)


def _allocate_kv(cfg: ModelConfig, layout: KVLayout, num_blocks: int,
                 dtype: torch.dtype) -> list[tuple[KVCache, KVCache]]:
    """One pool for all layers, K and V, sized exactly num_blocks * layout.bytes_per_block; int8
    adds the ledger's float32 scale per (layer, K/V, block, KV head) beside the values."""
    shape = (layout.num_layers, 2, num_blocks, layout.block_size, cfg.num_kv_heads, cfg.head_dim)
    if layout.kv_dtype == "int8":
        values = torch.zeros(shape, dtype=torch.int8)
        scales = torch.zeros(shape[:3] + shape[4:5], dtype=torch.float32)
        return [(Int8KVCache(values[i, 0], scales[i, 0]), Int8KVCache(values[i, 1], scales[i, 1]))
                for i in range(layout.num_layers)]
    cache_dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[layout.kv_dtype]
    pool = torch.zeros(shape, dtype=cache_dtype)
    return [(pool[i, 0], pool[i, 1]) for i in range(layout.num_layers)]
