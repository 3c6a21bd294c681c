"""Engine configuration: vLLM's names, validated once at the edge (LLM(), CLI, server)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tally.errors import ConfigError

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
# fp16 weights with fp32 compute (tally/layers/linear.py Fp16WeightLinear): never fp16 arithmetic on CPU
FP16_WEIGHT_NAMES = ("float16", "half", "fp16")
QUANTIZATIONS = (None, "none", "int8", "int4", "w8a8", "gguf")  # gguf: a GGUF file's blocks as stored
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "int8")


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None  # checkpoint dir, .gguf file, alias, or None for the built-in model
    dtype: str = "auto"  # see model_dtypes(); float16 = fp16 weights, fp32 compute
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
        if self.dtype not in ("auto", *DTYPES, *FP16_WEIGHT_NAMES):
            raise ConfigError(f"dtype {self.dtype!r} is not supported; use auto, float32, bfloat16 or float16")
        if self.dtype in FP16_WEIGHT_NAMES:
            from tally.layers.linear import fp16_weights_supported

            if not fp16_weights_supported():
                raise ConfigError("dtype float16 stores weights in fp16 for FBGEMM's fp16 GEMM, which this torch "
                                  "build lacks; use float32 or bfloat16")
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

    def model_dtypes(self, checkpoint_dtype: str, is_gguf: bool) -> tuple[torch.dtype, torch.dtype | None]:
        """(compute dtype, weight dtype of dense matmuls or None for the compute dtype).

        float16: fp16 weights, fp32 compute (fp16 arithmetic is unusably slow on CPUs). auto, for half-precision
        and GGUF checkpoints: bf16 where the CPU has bf16 instructions; elsewhere fp16 weights with fp32 compute,
        which reads half of fp32's bytes per decode step (2.2x faster matmuls here) and computes like fp32.
        fp32 checkpoints stay fp32."""
        from tally.engine.cpu import has_fast_bf16
        from tally.layers.linear import fp16_weights_supported

        if self.dtype in FP16_WEIGHT_NAMES:
            return torch.float32, torch.float16
        if self.dtype != "auto":
            return DTYPES[self.dtype], None
        if not (is_gguf or checkpoint_dtype in ("bfloat16", "float16")):
            return torch.float32, None
        if has_fast_bf16():
            return torch.bfloat16, None
        return torch.float32, torch.float16 if fp16_weights_supported() else None
