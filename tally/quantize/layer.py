"""One decoder layer at a time: HF-named fp32 weights + calibration statistics → what the checkpoint stores for
that layer, and the dense weights that stored form is equivalent to (for measuring it before writing).

rtn: round-to-nearest on each weight's own grid. gptq: tally/quantize/gptq.py with the layer's input Hessians.
awq: tally/quantize/awq.py scales, folded (o → v rows, down → up rows, q/k/v → input norm, gate/up → post-attention
norm), then round-to-nearest. smoothquant (w8a8 only): SmoothQuant's s = max|x|^α / max|w|^(1-α) per input channel
from calibration, folded the same way, then round-to-nearest; at run time the activations arrive already divided by
s, so per-token int8 covers a flatter range. Every method sees the full-precision model's activations
(tally/quantize/capture.py).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tally.errors import ConfigError
from tally.models.config import ModelConfig
from tally.quantize.awq import search_scales, tie_to_kv_heads, v_row_scale
from tally.quantize.capture import SiteStats
from tally.quantize.gptq import gptq_quantize
from tally.quantize.scheme import QuantScheme, fit_grid
from tally.quantize.smooth import smooth_scales
from tally.quantize.writer import packed_tensors

METHODS = ("gptq", "awq", "rtn", "smoothquant")
# Our fused modules (tally/models/decoder.py) → the HF projections they hold, in row order.
SITE_PROJECTIONS = {
    "qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "o_proj": ("self_attn.o_proj",),
    "gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
    "down_proj": ("mlp.down_proj",),
}
_INPUT_NORM = {"qkv_proj": "input_layernorm", "gate_up_proj": "post_attention_layernorm"}


@dataclass(frozen=True)
class QuantizeOptions:
    scheme: QuantScheme
    method: str = "gptq"
    act_order: bool = False
    alpha: float = 0.5  # SmoothQuant's migration strength: 0 leaves activations as they are, 1 flattens them fully

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"method {self.method!r} is not supported; use gptq, awq, rtn or smoothquant (w8a8)",
                              param="method")
        if self.method == "smoothquant" and self.scheme.name != "w8a8":
            raise ConfigError(f"smoothquant smooths activations for int8 matmuls; use --scheme w8a8 with it (for "
                              f"{self.scheme.label()} choose gptq, awq or rtn)", param="method")
        if not 0.0 <= self.alpha <= 1.0:
            raise ConfigError(f"--alpha {self.alpha} must be between 0 and 1 (SmoothQuant's default is 0.5)",
                              param="alpha")

    @property
    def needs_calibration(self) -> bool:
        return self.method != "rtn"


@dataclass
class LayerQuant:
    """`stored`: tensors that replace the layer's in the checkpoint (packed projections, AWQ-folded norms and
    biases); `effective`: the same replacements as dense fp32 weights (what the stored form computes)."""
    index: int
    stored: dict[str, torch.Tensor] = field(default_factory=dict)
    effective: dict[str, torch.Tensor] = field(default_factory=dict)
    awq_alphas: dict[str, float] = field(default_factory=dict)


def quantize_layer(index: int, weights: dict[str, torch.Tensor], cfg: ModelConfig,
                   stats: dict[tuple[int, str], SiteStats] | None, options: QuantizeOptions) -> LayerQuant:
    """`weights` is read, never modified."""
    p = f"model.layers.{index}"
    w = {n: weights[f"{p}.{n}.weight"].float().clone() for names in SITE_PROJECTIONS.values() for n in names}
    result = LayerQuant(index)
    if options.method == "awq":
        _fold_input_scales(p, w, weights, cfg, result, _awq_scales(index, stats, options.scheme, result))
    elif options.method == "smoothquant":
        _fold_input_scales(p, w, weights, cfg, result, _smoothquant_scales(index, stats, options.alpha))
    for site, names in SITE_PROJECTIONS.items():
        for n in names:
            name = f"{p}.{n}"
            if options.method == "gptq":
                q, grid = gptq_quantize(w[n], stats[(index, site)].hessian(), options.scheme,
                                        act_order=options.act_order)
            else:
                grid = fit_grid(w[n], options.scheme)
                q = grid.quantize(w[n])
            result.stored |= packed_tensors(name, q, grid, options.scheme)
            result.effective[f"{name}.weight"] = grid.dequantize(q)
    return result


# (site, the projections reading its input, kv-head tie or None) → per-input-channel scale s
ScaleFn = Callable[[str, list[torch.Tensor], tuple[int, int] | None], torch.Tensor]


def _awq_scales(index: int, stats: dict[tuple[int, str], SiteStats], scheme: QuantScheme,
                result: LayerQuant) -> ScaleFn:
    def scale(site: str, projections: list[torch.Tensor], tie: tuple[int, int] | None) -> torch.Tensor:
        s_stats = stats[(index, site)]
        s, alpha = search_scales(s_stats.sample(), s_stats.mean_abs(), projections, scheme, tie=tie)
        result.awq_alphas[site] = alpha
        return s
    return scale


def _smoothquant_scales(index: int, stats: dict[tuple[int, str], SiteStats], alpha: float) -> ScaleFn:
    def scale(site: str, projections: list[torch.Tensor], tie: tuple[int, int] | None) -> torch.Tensor:
        s = smooth_scales(stats[(index, site)].abs_max, projections, alpha)
        return s if tie is None else tie_to_kv_heads(s, *tie)
    return scale


def _fold_input_scales(p: str, w: dict[str, torch.Tensor], weights: dict[str, torch.Tensor], cfg: ModelConfig,
                       result: LayerQuant, scale_of: ScaleFn) -> None:
    """Scales every site's input columns by its scale and folds the inverse into what produces that input.
    Output-side folds (into v and up rows) come first, so the q/k/v and gate/up scales see the final weights."""
    def scale(site: str, tie: tuple[int, int] | None = None) -> torch.Tensor:
        s = scale_of(site, [w[n] for n in SITE_PROJECTIONS[site]], tie)
        for n in SITE_PROJECTIONS[site]:
            w[n] *= s
        return s

    s_o = scale("o_proj", tie=(cfg.num_kv_heads, cfg.head_dim))
    v_scale = v_row_scale(s_o, cfg.num_kv_heads, cfg.head_dim)
    w["self_attn.v_proj"] /= v_scale[:, None]
    v_bias = weights.get(f"{p}.self_attn.v_proj.bias")
    if v_bias is not None:
        _replace(result, f"{p}.self_attn.v_proj.bias", v_bias.float() / v_scale)
    s_down = scale("down_proj")
    w["mlp.up_proj"] /= s_down[:, None]
    for site in ("qkv_proj", "gate_up_proj"):
        s = scale(site)
        norm = f"{p}.{_INPUT_NORM[site]}.weight"
        _replace(result, norm, weights[norm].float() / s)


def _replace(result: LayerQuant, name: str, tensor: torch.Tensor) -> None:
    result.stored[name] = tensor
    result.effective[name] = tensor
