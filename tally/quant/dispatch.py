"""Which kernel serves how many tokens, and in which dtype the many-token path multiplies.

Each quantized layer has a few-token kernel (weight-only, reads 1 or 0.5 byte per weight: wins while decode is
bound by memory bandwidth) and a many-token path (dequantize tile by tile into a dense matmul: wins once the
work is compute-bound). The crossover depends on what the CPU computes fast (tally/platform.py says):
- without AVX-512 BF16 / AMX, oneDNN's bf16 matmul is an emulation up to 20x slower than fp32, so the many-token
  path multiplies in fp32 and casts the result back to the compute dtype;
- without VNNI, `torch._int_mm` is a scalar fallback (~70x slower than fp32 here), so W8A8 multiplies its int8
  operands as fp32 (the same integers, the same scales).
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


# First row count on the many-token path, bf16 compute, on a 2-core AMD EPYC whose VM exposes AVX2 only (no
# AVX-512): `python benchmarks/quant_kernels.py --threads 1` (2 threads was unmeasurable on the shared machine),
# the threshold minimising mean time-over-best across SmolLM2 and Qwen2.5-0.5B shapes, M = 1..128.
# E.g. 896x4864 at M=16 / 64: int8 kernel 3.60 / 30.1 ms vs fp32 dequant-matmul 3.31 / 22.6 ms; int4 kernel
# 3.57 / 22.6 vs 6.88 / 20.5 ms. q8_0 (GGUF keeps it for the tied embedding / lm_head) is chosen on the lm_head
# shape: 576x49152 at M=4 / 8 / 16: per-block kernel 16.1 / 61.2 / 56.7 ms vs dequant 23.1 / 68.1 / 30.6 ms.
_AVX2_BF16 = {"int8": 16, "int4": 64, "w8a8": 16, "q8_0": 16}
# AVX-512 BF16 + VNNI hosts: from the kernel table in MACHINE.md (896x4864, 2 threads): weight-only kernels beat
# bf16 at M=1 (0.13 vs 0.27 ms) and lose by M=8-32; `_int_mm` beats the int8 kernel from M=8 (0.26 vs 0.48 ms).
_AVX512_BF16 = {"int8": 8, "int4": 8, "w8a8": 8, "q8_0": 8}
# fp32 compute: the weight-only kernels are slow reference paths in fp32, so dequantize-and-matmul serves every
# batch. Measured here (1 thread, M=1, kernel vs dequant): 576x1536 int8 0.89 vs 0.26 ms, int4 1.76 vs 0.82 ms;
# 896x4864 int8 4.49 vs 0.95 ms, int4 12.9 vs 4.2 ms, q8_0 3.90 vs 2.66 ms.
_FP32 = {"int8": 1, "int4": 1, "w8a8": 1, "q8_0": 1}


def many_tokens_from(kind: str, compute_dtype: torch.dtype) -> int:
    """fp16 and other dtypes get the dense path always: the CPU weight-only kernels are not fast there."""
    if compute_dtype == torch.bfloat16:
        return (_AVX512_BF16 if has_fast_bf16() else _AVX2_BF16)[kind]
    if compute_dtype == torch.float32:
        return _FP32[kind]
    return 1
