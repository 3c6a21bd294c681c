"""AWQ (Lin et al. 2023): scale up the weight columns of input channels that carry large activations before
rounding, so those columns lose less; the activations are divided by the same scale, which is folded into the
RMSNorm (q/k/v, gate/up), into the v rows (o_proj) or into the up rows (down_proj), so serving costs nothing.

Per input site: s = mean|x|^alpha, normalised to a geometric mean of 1, alpha on a grid in [0, 1) chosen to
minimise || x W^T - x (Q(W diag(s)) diag(1/s))^T ||^2 summed over the projections reading x, on sampled calibration
rows; alpha = 0 is plain round-to-nearest, so on those rows AWQ never does worse than RTN. Then RTN group-wise.
"""
from __future__ import annotations

import torch

from tally.quantize.scheme import QuantScheme, rtn_dequantized

ALPHA_STEPS = 20
_MIN_SCALE = 1e-4


def search_scales(x: torch.Tensor, mean_abs: torch.Tensor, weights: list[torch.Tensor], scheme: QuantScheme,
                  *, tie: tuple[int, int] | None = None) -> tuple[torch.Tensor, float]:
    """x [T, K] sampled inputs, mean_abs [K]; weights [N_i, K] that read x. `tie` = (kv heads, head dim): the
    scale must be the same for every query head of a kv head (it will be folded into the shared v rows).
    Returns (s [K], chosen alpha)."""
    x = x.float()
    refs = [x @ w.float().T for w in weights]
    act = mean_abs.float() if tie is None else tie_to_kv_heads(mean_abs.float(), *tie)
    best = (float("inf"), torch.ones_like(act), 0.0)
    for step in range(ALPHA_STEPS):
        alpha = step / ALPHA_STEPS
        s = act.pow(alpha).clamp(min=_MIN_SCALE)
        s = s / (s.max() * s.min()).sqrt()
        loss = sum(((x @ (rtn_dequantized(w.float() * s, scheme) / s).T - ref) ** 2).sum().item()
                   for w, ref in zip(weights, refs))
        if loss < best[0]:
            best = (loss, s, alpha)
    return best[1], best[2]


def tie_to_kv_heads(x: torch.Tensor, kv_heads: int, head_dim: int) -> torch.Tensor:
    """x [query heads * head dim] averaged over the query heads that share a kv head, so a scale of o_proj's input
    can be folded into the shared v rows."""
    per_kv = x.view(kv_heads, -1, head_dim)
    return per_kv.mean(1, keepdim=True).expand_as(per_kv).reshape(-1)


def v_row_scale(s: torch.Tensor, kv_heads: int, head_dim: int) -> torch.Tensor:
    """The o_proj input scale (tied per kv head, see `tie`) as one scale per v_proj output row."""
    return s.view(kv_heads, -1, head_dim)[:, 0, :].reshape(-1)
