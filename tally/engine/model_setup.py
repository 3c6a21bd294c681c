"""Start-up: checkpoint → model → KV pool sized by the ledger → the ledger the engine logs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tally.attention.backend import make_backend
from tally.attention.kv_cache import Int8KVCache, KVCache
from tally.engine.config import EngineConfig
from tally.engine.path_tuning import PathChoice, choose_path
from tally.errors import ConfigError
from tally.layers.path_timing import use_bf16_many_tokens
from tally.ledger.kv import KVLayout
from tally.ledger.report import EngineLedger
from tally.models.builder import build_model
from tally.models.config import ModelConfig
from tally.models.generation_config import sampling_defaults
from tally.models.key_smoothing import calibration_ids, measure_key_scales
from tally.models.llama import CausalLM
from tally.models.loader import Checkpoint, load_checkpoint
from tally.models.projection_shapes import projection_shapes
from tally.models.tokenizer import load_tokenizer, stop_token_ids
from tally.platform import available_ram_bytes, parse_cpu_list, physical_cores, pin_process

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


def load_model(config: EngineConfig) -> LoadedModel:
    torch.manual_seed(config.seed)
    if config.cpu_affinity is not None:
        pin_process(parse_cpu_list(config.cpu_affinity))
    torch.set_num_threads(config.threads or physical_cores())
    ckpt = load_checkpoint(config.model)
    cfg = ckpt.config
    tokenizer = load_tokenizer(ckpt)
    path = measured_path(config, ckpt)
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
    model = build_model(cfg, dict(ckpt.tensors()), dtype=dtype, quantization=path.candidate.quantization,
                        attn=attn, max_model_len=max_model_len, checkpoint=ckpt, weight_dtype=weight_dtype)
    if path.many_tokens_from is not None:
        use_bf16_many_tokens(list(model.modules()), path.many_tokens_from)
    weight_bytes = (sum(t.numel() * t.element_size() for t in _unique_tensors(model))
                    + sum(getattr(m, "packed_bytes", 0) for m in model.modules()))

    kv_dtype_name = _DTYPE_NAMES[dtype] if config.kv_cache_dtype == "auto" else config.kv_cache_dtype
    if kv_dtype_name == "int8":
        model.set_key_smoothing(measure_key_scales(model, calibration_ids(tokenizer)))
    layout = KVLayout.for_model(cfg, kv_dtype=kv_dtype_name, block_size=config.block_size)
    budget = config.kv_cache_memory
    if budget is None:
        # Like vLLM's CPU backend, a bounded default: zero-filling a pool costs ~2 s per GB here, and
        # a pool larger than max_num_seqs full-length requests can never be used.
        useful = config.max_num_seqs * layout.bytes_for_tokens(max_model_len)
        budget = min(int(available_ram_bytes() * config.kv_cache_memory_fraction), DEFAULT_KV_CAP_BYTES, useful)
    num_blocks = layout.num_blocks_for_budget(budget)
    if num_blocks * config.block_size < max_model_len:
        raise ConfigError(
            f"the KV cache budget ({budget:,} bytes) holds {num_blocks * config.block_size:,} tokens, fewer than "
            f"one request of max_model_len {max_model_len:,}; raise --kv-cache-memory to ≥ "
            f"{layout.bytes_for_tokens(max_model_len):,} or lower --max-model-len")
    kv_caches = _allocate_kv(cfg, layout, num_blocks, dtype)
    ledger = EngineLedger(
        model_name=(config.served_model_names or (ckpt.name,))[0],
        weight_bytes=weight_bytes,
        kv_blocks=num_blocks,
        block_size=config.block_size,
        kv_bytes_per_token=layout.bytes_per_token,
        kv_pool_bytes=num_blocks * layout.bytes_per_block,
        reserve_bytes=0,
        max_model_len=max_model_len,
        max_num_seqs=config.max_num_seqs,
        path=path.to_dict(),
    )
    return LoadedModel(
        name=(config.served_model_names or (ckpt.name,))[0], config=cfg, tokenizer=tokenizer,
        stop_token_ids=stop_token_ids(tokenizer, cfg), model=model, kv_caches=kv_caches, kv_layout=layout,
        num_blocks=num_blocks, max_model_len=max_model_len, ledger=ledger,
        sampling_defaults=sampling_defaults(config.generation_config, ckpt.path))


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
    shape = (cfg.num_layers, 2, num_blocks, layout.block_size, cfg.num_kv_heads, cfg.head_dim)
    if layout.kv_dtype == "int8":
        values = torch.zeros(shape, dtype=torch.int8)
        scales = torch.zeros(shape[:3] + shape[4:5], dtype=torch.float32)
        return [(Int8KVCache(values[i, 0], scales[i, 0]), Int8KVCache(values[i, 1], scales[i, 1]))
                for i in range(cfg.num_layers)]
    cache_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[layout.kv_dtype]
    pool = torch.zeros(shape, dtype=cache_dtype)
    return [(pool[i, 0], pool[i, 1]) for i in range(cfg.num_layers)]


def _unique_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    seen, out = set(), []
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            out.append(t)
    return out
