"""The draft model of `{"method": "draft_model"}` speculation, loaded beside the target and checked against it once,
at start-up: the same vocabulary (its proposals are the target's token ids), a context as long as max_model_len,
one process. Its weights run the projection path measured for the target; its KV cache has the target's dtype, in a
pool of its own sized for the requests it drafts for (tally/engine/speculation/draft_kv.py,
tally/engine/startup/sizing.py). A sliding-window draft masks its own tables by its windows, as the target does; its
tables keep the blocks its windows left behind (the pool is sized for whole tables)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tally.attention.kv_cache import KVCache
from tally.engine.config import EngineConfig
from tally.errors import ConfigError, ModelLoadError
from tally.layers.path_timing import use_bf16_many_tokens
from tally.ledger.kv import KVLayout
from tally.models.builder import build_model, model_attention
from tally.models.config import ModelConfig
from tally.models.key_smoothing import calibration_ids, measure_key_scales
from tally.models.decoder import CausalLM
from tally.models.loader import load_checkpoint
from tally.models.tokenizer import Tokenizer, load_tokenizer


@dataclass
class DraftModel:
    name: str
    config: ModelConfig
    model: CausalLM
    layout: KVLayout  # its KV per block of its own pool
    weight_bytes: int
    num_blocks: int = 0  # its pool's, set with kv_caches once the budget is divided
    kv_caches: list[tuple[KVCache, KVCache]] = field(default_factory=list)


def load_draft(config: EngineConfig, target: ModelConfig, target_tokenizer: Tokenizer, dtype: torch.dtype,
               weight_dtype: torch.dtype | None, max_model_len: int, kv_dtype_name: str,
               many_tokens_from: int | None = None) -> DraftModel:
    """`many_tokens_from`: the rows from which the target's projections take the bf16 path (PathChoice); the draft's
    do too, or its catch-up over a prompt (hundreds of rows) runs on the one-token integer kernels: 2-3 s a request
    for Qwen2.5-Coder-0.5B here."""
    spec = config.speculative
    if config.world_size > 1:
        raise ConfigError("draft_model speculation runs in one process; use tensor_parallel_size 1 and "
                          "pipeline_parallel_size 1, or the ngram method")
    try:
        ckpt = load_checkpoint(spec.model)
    except ModelLoadError as exc:
        raise ConfigError(f"speculative_config's draft model: {exc}") from exc
    cfg = ckpt.config
    if cfg.vocab_size != target.vocab_size:
        raise ConfigError(f"draft model {ckpt.name} has a vocabulary of {cfg.vocab_size:,} tokens, the target "
                          f"{target.vocab_size:,}; a draft must share the target's tokenizer")
    draft_vocab, target_vocab = load_tokenizer(ckpt).get_vocab(), target_tokenizer.get_vocab()
    if draft_vocab != target_vocab:
        differ = len(set(draft_vocab.items()) ^ set(target_vocab.items()))
        raise ConfigError(f"draft model {ckpt.name}'s tokenizer differs from the target's ({differ:,} token "
                          "entries differ); a draft must share the target's tokenizer")
    if spec.draft_vocab_size > cfg.vocab_size:
        raise ConfigError(f"draft_vocab_size {spec.draft_vocab_size:,} is larger than the vocabulary "
                          f"({cfg.vocab_size:,} tokens); use at most that, or 0 for the whole vocabulary")
    if cfg.max_position_embeddings < max_model_len:
        raise ConfigError(f"draft model {ckpt.name} has a context of {cfg.max_position_embeddings:,} tokens, "
                          f"shorter than max_model_len {max_model_len:,}; lower --max-model-len to ≤ "
                          f"{cfg.max_position_embeddings} or choose another draft")
    attn = model_attention(config.attention_backend, cfg, dtype)
    tensors = ckpt.tensor_map(config.load_progress(), lambda _: True, None)
    model = build_model(cfg, tensors, dtype=dtype, quantization=config.served_quantization(ckpt.format == "gguf"),
                        attn=attn, max_model_len=max_model_len, checkpoint=ckpt, weight_dtype=weight_dtype)
    if many_tokens_from is not None:
        use_bf16_many_tokens(list(model.modules()), many_tokens_from)
    if kv_dtype_name == "int8":
        model.set_key_smoothing(measure_key_scales(model, calibration_ids(target_tokenizer)))
    layout = KVLayout.for_model(cfg, kv_dtype=kv_dtype_name, block_size=config.block_size)
    return DraftModel(ckpt.name, cfg, model, layout, model_weight_bytes(model))


def model_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of a model's weights: every distinct tensor once, plus packed integer panels held outside them."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total + sum(getattr(m, "packed_bytes", 0) for m in model.modules())
