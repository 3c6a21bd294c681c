"""The target model from its checkpoint: each tensor cut to this rank's slice as it is read, built on the measured
path."""
from __future__ import annotations

from tally.engine.config import EngineConfig
from tally.engine.parallel.distributed import ParallelContext
from tally.engine.startup.path_tuning import PathChoice
from tally.errors import ConfigError
from tally.layers.path_timing import use_bf16_many_tokens
from tally.models.builder import build_model, model_attention
from tally.models.config import ModelConfig
from tally.models.decoder import CausalLM
from tally.models.loader import Checkpoint
from tally.models.pipeline_split import PPStage
from tally.models.tensor_parallel import TPShard


def context_length(config: EngineConfig, cfg: ModelConfig) -> int:
    """--max-model-len, or the model's own context length; never beyond the latter."""
    max_model_len = config.max_model_len or cfg.max_position_embeddings
    if max_model_len > cfg.max_position_embeddings:
        raise ConfigError(
            f"max_model_len {max_model_len:,} exceeds the model's context length "
            f"{cfg.max_position_embeddings:,}; use --max-model-len ≤ {cfg.max_position_embeddings}")
    return max_model_len


def build_target(config: EngineConfig, ckpt: Checkpoint, cfg: ModelConfig, path: PathChoice, max_model_len: int,
                 shard: TPShard | None, stage: PPStage | None, parallel: ParallelContext | None) -> CausalLM:
    """This rank's model: no rank ever holds the whole of it, and a pipeline stage reads only its own layers."""
    dtype, weight_dtype = path.candidate.dtypes
    # Attention computes in the model's dtype, as transformers does (SDPA accumulates in fp32 inside): converting
    # each layer's context to fp32 first cost a fifth of a bf16 step (docs/benchmarks.md#attention).
    attn = model_attention(config.attention_backend, cfg, dtype)
    progress = config.load_progress(parallel.env.rank if parallel is not None else 0)
    tensors = ckpt.tensor_map(progress, stage.holds if stage is not None else lambda _: True,
                              shard.shard if shard is not None else None)
    model = build_model(cfg, tensors, dtype=dtype, quantization=path.candidate.quantization,
                        attn=attn, max_model_len=max_model_len, checkpoint=ckpt, weight_dtype=weight_dtype,
                        parallel=(shard, parallel.tp) if shard is not None else None, stage=stage)
    if path.many_tokens_from is not None:
        use_bf16_many_tokens(list(model.modules()), path.many_tokens_from)
    return model
