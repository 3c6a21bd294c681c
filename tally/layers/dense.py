"""Projections that keep a dense weight: as is, in fp16 for fp32 compute, or several side by side.
Built through tally/layers/linear.py, the one place that chooses a projection's layer."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tally.native import ops as native
from tally.quant.base import BF16_TILE_BYTES, CACHED_KERNEL_DTYPES, pad_rows, tiled_matmul
from tally.quant.dispatch import NEVER


class DenseLinear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.to(dtype), requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.to(dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _linear(x, self.weight, self.bias)

    def first_outputs(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """Outputs 0..n-1 alone, from their weights' rows only (a draft's reduced vocabulary,
        tally/engine/speculation/config.py: draft_vocab_size)."""
        return _linear(x, self.weight[:n], None if self.bias is None else self.bias[:n])


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if weight.dtype not in CACHED_KERNEL_DTYPES:
        return F.linear(x, weight, bias)
    x2 = x.reshape(-1, x.shape[-1])  # padded rows keep oneDNN's kernel cache bounded (tally/quant/base.py)
    return F.linear(pad_rows(x2), weight, bias)[:x2.shape[0]].view(*x.shape[:-1], -1)


class Fp16WeightLinear(nn.Module):
    """Weights stored in fp16, inputs and outputs fp32, no fp16 arithmetic (unusably slow on CPUs): a memory-bound
    decode step reads half of fp32's bytes. On AVX2 CPUs the weights are the native kernel's panels
    (tally/native: converted with F16C, multiplied in fp32), which also lets the one-call decode step take this
    layer; FBGEMM's packed fp16 GEMM serves where the native kernels are unavailable
    (docs/benchmarks.md#paths-chosen-by-measurement compares the two). Where the CPU multiplies bf16 much faster
    (AVX-512 BF16, AMX), the start-up measurement may send rows from a measured count on to a bf16 matmul over panels
    converted a few at a time (`use_many_tokens`)."""

    many_tokens_from = NEVER
    panel_dtype = torch.float16

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("bias", None if bias is None else bias.float().contiguous())
        self._packed = None
        self.register_buffer("panels", None)
        if native.available():
            self.panels = native.pack_f16(weight, self.panel_dtype)
        else:
            self._packed = torch.ops.quantized.linear_prepack_fp16(weight.float(), None)
            self.embedding_rows = None  # FBGEMM's packed layout cannot be read back

    @property
    def packed_bytes(self) -> int:
        """What FBGEMM's packed weights hold (the ledger counts them; they are not a tensor of the module)."""
        return 0 if self._packed is None else self.out_features * self.in_features * 2

    def use_many_tokens(self, from_rows: int, dtype: torch.dtype = torch.bfloat16) -> None:
        """Rows from `from_rows` on multiply in bf16 (the only many-token dtype of the panels)."""
        if self.panels is None or dtype != torch.bfloat16 or self.panel_dtype != torch.float16:
            raise ValueError("the fp16 panels' many-token path needs the native kernels and bf16")
        self.many_tokens_from = from_rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.panels is None:
            y = torch.ops.quantized.linear_dynamic_fp16(x, self._packed)
            return y if self.bias is None else y + self.bias
        x2 = x.reshape(-1, self.in_features).float().contiguous()
        if x2.shape[0] >= self.many_tokens_from:
            y = tiled_matmul(x2, self.out_features, torch.bfloat16, self._weight_t, native.PANEL, BF16_TILE_BYTES)
            y = y[:, :self.out_features].float()
            if self.bias is not None:
                y += self.bias
        else:
            y = self._gemm(x2, self.out_features, self.bias)
        return y.view(*x.shape[:-1], self.out_features)

    def first_outputs(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """As DenseLinear.first_outputs: the first panels only (FBGEMM's packed weights: every output, then n)."""
        if self.panels is None:
            return self(x)[..., :n]
        x2 = x.reshape(-1, self.in_features).float().contiguous()
        y = self._gemm(x2, n, None if self.bias is None else self.bias[:n])
        return y.view(*x.shape[:-1], n)

    def _gemm(self, x2: torch.Tensor, n: int, bias: torch.Tensor | None) -> torch.Tensor:
        return native.gemm_f16(x2, self.panels, n, bias)

    def _weight_t(self, n0: int, n1: int) -> torch.Tensor:
        return native.dequant_f16_bf16_t(self.panels[n0 // native.PANEL:n1 // native.PANEL])

    def embedding_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of the weight as fp32 [len(ids), K]: a tied embedding read from the head's panels."""
        return native.panel_rows(self.panels, ids)

    def zero_(self) -> None:
        """Deliberate damage for the quality gate's self-test (tally/quality/corrupt.py)."""
        if self.panels is not None:
            self.panels.zero_()
        else:
            self._packed = torch.ops.quantized.linear_prepack_fp16(
                torch.zeros(self.out_features, self.in_features), None)
        if self.bias is not None:
            self.bias.zero_()


class Fp32PanelLinear(Fp16WeightLinear):
    """fp32 weights in the same panels, read by the same kernel (native gemm_f32): every output is one FMA chain over k
    in a fixed order at any row count, where PyTorch's BLAS blocks its sums by the shape, so a row's outputs would
    change with the rows beside it. The batch-invariant path of fp32 compute over a dense weight
    (tally/engine/config.py PathCandidate); built only where the native kernels are."""

    panel_dtype = torch.float32

    def _gemm(self, x2: torch.Tensor, n: int, bias: torch.Tensor | None) -> torch.Tensor:
        return native.gemm_f32(x2, self.panels, n, bias)


class Bf16PanelLinear(Fp16WeightLinear):
    """bf16 weights (`--dtype bfloat16`) in the same panels, widened exactly to fp32 by the same kernel (native
    gemm_bf16), each output rounded once to bf16: one FMA chain over k at any row count, where a bf16 matmul's
    blocking may follow the row count (oneDNN's kernels on CPUs with bf16 instructions). Built only where the native
    kernels are, under batch_invariant (tally/engine/config.py PathCandidate)."""

    panel_dtype = torch.bfloat16

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x).to(x.dtype)

    def first_outputs(self, x: torch.Tensor, n: int) -> torch.Tensor:
        return super().first_outputs(x, n).to(x.dtype)

    def _gemm(self, x2: torch.Tensor, n: int, bias: torch.Tensor | None) -> torch.Tensor:
        return native.gemm_bf16(x2, self.panels, n, bias)

    def embedding_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of the weight as bf16 [len(ids), K] (exact: the panels hold them so)."""
        return native.panel_rows(self.panels, ids).to(self.panel_dtype)


class ConcatLinear(nn.Module):
    """Several projections of the same input, outputs side by side: a fused projection whose parts are stored
    differently (e.g. a GGUF with q/k in Q4_1 and v in Q8_0), so the model code still sees one module."""

    def __init__(self, parts: list[nn.Module]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([part(x) for part in self.parts], dim=-1)

