"""Engine configuration: vLLM's names, validated once at the edge (LLM(), CLI, server)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tally.errors import ConfigError

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
QUANTIZATIONS = (None, "none", "int8", "int4", "w8a8", "gguf")  # gguf: a GGUF file's blocks as stored
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "int8")


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None  # checkpoint dir, .gguf file, alias, or None for the built-in model
    dtype: str = "auto"  # see torch_dtype(); float16 is refused on CPU
    quantization: str | None = None
    max_model_len: int | None = None  # None: the model's context length
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    max_num_partial_prefills: int = 1
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    block_size: int = 16
    kv_cache_dtype: str = "auto"
    kv_cache_memory: int | None = None  # bytes for the KV pool; None: min(fraction of free RAM, 2 GiB)
    kv_cache_memory_fraction: float = 0.25
    scheduling: str = "continuous"  # "static" exists only to show what continuous batching buys
    attention_backend: str = "auto"  # reference | tiled | auto (tiled for long prefills)
    seed: int = 0
    served_model_name: str | None = None

    def __post_init__(self) -> None:
        if self.dtype not in ("auto", *DTYPES):
            hint = " (fp16 runs at 0.4 GFLOP/s on this CPU)" if self.dtype in ("float16", "half") else ""
            raise ConfigError(f"dtype {self.dtype!r} is not supported{hint}; use auto, float32 or bfloat16")
        if self.quantization not in QUANTIZATIONS:
            raise ConfigError(f"quantization {self.quantization!r} unknown; use one of int8, int4, w8a8, gguf")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(f"kv_cache_dtype {self.kv_cache_dtype!r} unknown; use one of {KV_CACHE_DTYPES}")
        if self.scheduling not in ("continuous", "static"):
            raise ConfigError("scheduling must be 'continuous' or 'static'")
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "max_num_partial_prefills"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ConfigError(f"max_model_len must be ≥ 1, got {self.max_model_len}")
        if not 0 < self.kv_cache_memory_fraction <= 0.9:
            raise ConfigError("kv_cache_memory_fraction must be in (0, 0.9]")

    def torch_dtype(self, checkpoint_dtype: str, is_gguf: bool) -> torch.dtype:
        """auto: bf16 for half-precision and GGUF checkpoints where the CPU has bf16 instructions,
        else fp32 (fp16 is never used: its CPU matmul is unusably slow)."""
        if self.dtype != "auto":
            return DTYPES[self.dtype]
        from tally.engine.cpu import has_fast_bf16

        if (is_gguf or checkpoint_dtype in ("bfloat16", "float16")) and has_fast_bf16():
            return torch.bfloat16
        return torch.float32
