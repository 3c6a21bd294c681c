"""Which kernel serves how many tokens, and in which dtype the many-token path multiplies.

Each quantized layer has a few-token kernel (weight-only, reads 1 or 0.5 byte per weight: wins while decode is
bound by memory bandwidth) and a many-token path (dequantize tile by tile into a dense matmul: wins once the
work is compute-bound). The crossover depends on what the CPU computes fast (tally/platform.py says):
- without AVX-512 BF16 / AMX, oneDNN's bf16 matmul is an emulation many times slower than fp32, so the many-token
  path multiplies in fp32 and casts the result back to the compute dtype;
- without VNNI, `torch._int_mm` is a scalar fallback far slower than fp32, so W8A8 multiplies its int8 operands as
  fp32 (the same integers, the same scales).
"""
from __future__ import annotations

import torch

from tally.platform import has_fast_bf16

NEVER = 1 << 62  # a threshold no batch reaches: the few-token kernel serves every batch size


def matmul_dtype(compute_dtype: torch.dtype) -> torch.dtype:
    """The dtype the many-token path multiplies in (results are cast back to compute_dtype)."""
    if compute_dtype == torch.bfloat16 and not has_fast_bf16():
        return torch.float32
    return compute_dtype


# First row count on the many-token path, bf16 compute, on AVX2-only CPUs: the threshold that minimises the mean
# time over the best path across small models' shapes (docs/benchmarks.md#paths-chosen-by-measurement;
# `python benchmarks/quant_kernels.py`); q8_0 (GGUF keeps it for the tied embedding / LM head) on the head's shape.
_AVX2_BF16 = {"int8": 16, "int4": 64, "w8a8": 16, "q8_0": 16}
# AVX-512 BF16 + VNNI hosts: weight-only kernels win at one row and lose by 8-32 rows; `_int_mm` beats the int8
# kernel from 8 rows (docs/benchmarks.md#paths-chosen-by-measurement).
_AVX512_BF16 = {"int8": 8, "int4": 8, "w8a8": 8, "q8_0": 8}
# fp32 compute: the weight-only kernels are slow reference paths in fp32, so dequantize-and-matmul serves every
# batch, one row included.
_FP32 = {"int8": 1, "int4": 1, "w8a8": 1, "q8_0": 1}


def many_tokens_from(kind: str, compute_dtype: torch.dtype) -> int:
    """fp16 and other dtypes get the dense path always: the CPU weight-only kernels are not fast there."""
    if compute_dtype == torch.bfloat16:
        return (_AVX512_BF16 if has_fast_bf16() else _AVX2_BF16)[kind]
    if compute_dtype == torch.float32:
        return _FP32[kind]
    return 1
