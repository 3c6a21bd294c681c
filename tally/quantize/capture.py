"""Calibration activations from our own model: one sequence at a time through CausalLM.forward (a one-block KV
cache of its own, the reference attention), with forward pre-hooks on the four projections of every layer.

Every projection sees the *full-precision* model's activations (GPTQ is not run layer by layer on the quantized
prefix; see docs/quantization.md), so one pass over the calibration set serves every layer and every method.
Per input site (a layer's qkv / o / gate_up / down input) it keeps: the Hessian sum X^T X (GPTQ), the mean |x| per
channel (AWQ), the max |x| per channel (SmoothQuant), and a few rows per sample (AWQ's grid search and the error
figures)."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from tally.models.decoder import CausalLM
from tally.models.prefill import prefill

SITES = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


@dataclass
class SiteStats:
    xtx: torch.Tensor | None  # fp64 [K, K] sum of x x^T, or None when not asked for
    abs_sum: torch.Tensor  # fp64 [K] sum of |x|
    abs_max: torch.Tensor  # fp32 [K] max |x| (SmoothQuant)
    rows: list[torch.Tensor] = field(default_factory=list)  # sampled input rows, fp32
    count: int = 0

    def hessian(self) -> torch.Tensor:
        """GPTQ's H = 2 X^T X / n."""
        return (2.0 * self.xtx / max(self.count, 1)).float()

    def mean_abs(self) -> torch.Tensor:
        return (self.abs_sum / max(self.count, 1)).float()

    def sample(self) -> torch.Tensor:
        return torch.cat(self.rows)


def capture(model: CausalLM, samples: Iterable[list[int]], *, hessian: bool,
            rows_per_sample: int = 32) -> dict[tuple[int, str], SiteStats]:
    """{(layer index, site): stats} over every token of every sample."""
    stats: dict[tuple[int, str], SiteStats] = {}
    gen = torch.Generator().manual_seed(0)
    handles = []

    def hook(key: tuple[int, str]):
        def record(_module, args):
            x = args[0].reshape(-1, args[0].shape[-1]).float()
            s = stats.get(key)
            if s is None:
                k = x.shape[1]
                s = stats[key] = SiteStats(torch.zeros(k, k, dtype=torch.float64) if hessian else None,
                                           torch.zeros(k, dtype=torch.float64), torch.zeros(k))
            if s.xtx is not None:
                s.xtx.add_(x.T @ x)  # one sample's sum in fp32 (fast), the running sum in fp64
            s.abs_sum.add_(x.abs().sum(0).double())
            torch.maximum(s.abs_max, x.abs().amax(0), out=s.abs_max)
            s.count += x.shape[0]
            pick = torch.randperm(x.shape[0], generator=gen)[:rows_per_sample]
            s.rows.append(x[pick].clone())
        return record

    for i, layer in enumerate(model.layers):
        for site in SITES:
            handles.append(getattr(layer, site).register_forward_pre_hook(hook((i, site))))
    try:
        for ids in samples:
            prefill(model, ids)
    finally:
        for h in handles:
            h.remove()
    return stats
