"""The one place a projection is built: dense here, quantized schemes in tally/quant."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class DenseLinear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.to(dtype), requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.to(dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class Fp16WeightLinear(nn.Module):
    """Weights stored in fp16, inputs and outputs fp32: FBGEMM's packed fp16 GEMM converts the weights on the
    fly (F16C) and accumulates in fp32, so a memory-bound decode step reads half of fp32's bytes without any
    fp16 arithmetic (which is unusably slow on CPUs). `python bench/weight_formats.py --model smol --threads 1`,
    all of SmolLM2's projections in sequence: 1 row 20.2 vs 43.7 ms fp32, 8 rows 37.6 vs 92.5, 32 rows 113.2 vs 169.9."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.has_bias = bias is not None
        self._packed = torch.ops.quantized.linear_prepack_fp16(weight.float(), None if bias is None else bias.float())

    @property
    def packed_bytes(self) -> int:
        """What the packed weights hold (the ledger counts them; they are not a parameter)."""
        return self.out_features * self.in_features * 2 + (self.out_features * 4 if self.has_bias else 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic_fp16(x, self._packed)

    def zero_(self) -> None:
        """Deliberate damage for the quality gate's self-test (tally/quality/corrupt.py)."""
        zeros = torch.zeros(self.out_features, self.in_features)
        self._packed = torch.ops.quantized.linear_prepack_fp16(
            zeros, torch.zeros(self.out_features) if self.has_bias else None)


def fp16_weights_supported() -> bool:
    return "fbgemm" in torch.backends.quantized.supported_engines


class ConcatLinear(nn.Module):
    """Several projections of the same input, outputs side by side: a fused projection whose parts are stored
    differently (e.g. a GGUF with q/k in Q4_1 and v in Q8_0), so the model code still sees one module."""

    def __init__(self, parts: list[nn.Module]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([part(x) for part in self.parts], dim=-1)


def build_linear(weight: torch.Tensor, bias: torch.Tensor | None, *, quantization: str | None,
                 dtype: torch.dtype, weight_dtype: torch.dtype | None = None) -> nn.Module:
    """`weight_dtype=torch.float16` (fp32 compute only) stores a dense layer's weights in fp16."""
    if quantization in (None, "none"):
        if weight_dtype == torch.float16 and dtype == torch.float32:
            return Fp16WeightLinear(weight, bias)
        return DenseLinear(weight, bias, dtype)
    from tally.quant.linear import make_linear

    # The largest int4 group that divides the layer (128 for real models; tiny test models need less).
    in_features = weight.shape[1]
    group_size = next((g for g in (128, 64, 32) if in_features % g == 0), 128)
    return make_linear(weight, bias, scheme=quantization, compute_dtype=dtype, group_size=group_size)
