"""SmoothQuant: move activation outliers into the weights before W8A8 quantization.

Per input channel j, s_j = max|X_j|^alpha / max|W_:j|^(1 - alpha); the layer uses W·diag(s) and X·diag(1/s),
which leaves the product unchanged and flattens the per-channel activation range that per-token int8 must cover.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

_MIN_ABSMAX = 1e-5


def smooth_scales(act_absmax: torch.Tensor, weight: torch.Tensor | Sequence[torch.Tensor],
                  alpha: float = 0.5) -> torch.Tensor:
    """act_absmax [K]: calibration max |x| per input channel. `weight` [N, K], or several that read the same
    activations (q/k/v after one norm, gate/up after another): they must share one s. Returns s [K] fp32."""
    weights = [weight] if isinstance(weight, torch.Tensor) else list(weight)
    w_absmax = torch.stack([w.float().abs().amax(dim=0) for w in weights]).amax(dim=0)
    act = act_absmax.float().clamp(min=_MIN_ABSMAX)
    return (act.pow(alpha) / w_absmax.clamp(min=_MIN_ABSMAX).pow(1.0 - alpha)).clamp(min=_MIN_ABSMAX)


def fold_smoothing_into_norm(norm_weight: torch.Tensor, smooth: torch.Tensor) -> torch.Tensor:
    """The RMSNorm weight that makes the norm emit x / s (RMSNorm is x * rsqrt(mean x^2) * weight, so dividing its
    weight divides its output); build the layers after it with `smoothing_folded=True`."""
    return (norm_weight.float() / smooth.float()).to(norm_weight.dtype)
