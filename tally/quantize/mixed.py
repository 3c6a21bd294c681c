"""Mixed precision: which decoder layers stay in high precision.

Named (`--keep-high-precision first,last,3`) or measured (`--auto-mixed K`): a layer's sensitivity is the relative
error of the model's final hidden states on calibration samples when only that layer is replaced by its quantized
form, everything else full precision; the K most sensitive layers stay dense. The lm_head is always dense in
Tally (it is the tied embedding on the models we serve), so `lm_head` is accepted and changes nothing.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from tally.errors import ConfigError
from tally.models.config import ModelConfig
from tally.models.decoder import CausalLM
from tally.models.prefill import prefill
from tally.quantize.layer import SITE_PROJECTIONS, LayerQuant

_NORMS = {"input_layernorm": "input_norm", "post_attention_layernorm": "post_attn_norm"}


def parse_keep(text: str | None, num_layers: int) -> frozenset[int]:
    """'first,last,lm_head,5' → decoder layer indices to keep dense."""
    keep: set[int] = set()
    for item in filter(None, (t.strip().lower() for t in (text or "").split(","))):
        if item == "first":
            keep.add(0)
        elif item == "last":
            keep.add(num_layers - 1)
        elif item == "lm_head":
            continue
        elif item.isdigit() and int(item) < num_layers:
            keep.add(int(item))
        else:
            raise ConfigError(f"--keep-high-precision item {item!r} is not understood; use first, last, lm_head or "
                              f"a layer index 0..{num_layers - 1}", param="keep_high_precision")
    return frozenset(keep)


def swap_in(model: CausalLM, cfg: ModelConfig, layer: LayerQuant) -> Callable[[], None]:
    """Put `layer.effective` weights into the dense fp model's layer; returns the function that undoes it."""
    module = model.layers[layer.index]
    p = f"model.layers.{layer.index}"
    sizes = {"qkv_proj": [cfg.q_size, cfg.kv_size, cfg.kv_size], "gate_up_proj": [cfg.intermediate_size] * 2}
    saved = []

    def put(param: torch.nn.Parameter, value: torch.Tensor) -> None:
        saved.append((param, param.data))
        param.data = value.to(param.dtype)

    for site, names in SITE_PROJECTIONS.items():
        dense = getattr(module, site)
        for key in ("weight", "bias"):
            param = getattr(dense, key)
            if param is None or not any(f"{p}.{n}.{key}" in layer.effective for n in names):
                continue
            parts = list(param.data.split(sizes.get(site, [param.shape[0]])))
            parts = [layer.effective.get(f"{p}.{n}.{key}", part) for n, part in zip(names, parts)]
            put(param, torch.cat(parts))
    for hf_norm, attr in _NORMS.items():
        value = layer.effective.get(f"{p}.{hf_norm}.weight")
        if value is not None:
            put(getattr(module, attr).weight, value)

    def restore() -> None:
        for param, data in saved:
            param.data = data
    return restore


def layer_sensitivity(model: CausalLM, cfg: ModelConfig, samples: list[list[int]],
                      layers: Iterable[LayerQuant]) -> dict[int, float]:
    """{layer index: ||h_q - h||^2 / ||h||^2 of the final hidden states} with only that layer quantized."""
    reference = [prefill(model, ids) for ids in samples]
    norm = sum(float((h ** 2).sum()) for h in reference)
    out = {}
    for layer in layers:
        restore = swap_in(model, cfg, layer)
        try:
            out[layer.index] = sum(float(((prefill(model, ids) - h) ** 2).sum())
                                   for ids, h in zip(samples, reference)) / norm
        finally:
            restore()
    return out


def most_sensitive(sensitivity: dict[int, float], count: int) -> frozenset[int]:
    return frozenset(sorted(sensitivity, key=sensitivity.get, reverse=True)[:count])
