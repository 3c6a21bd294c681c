"""Deliberate damage for gating the gate: `zero-layer:N` zeroes every floating-point weight of decoder
layer N (dense or quantized), leaving the layer a pass-through on the residual stream. A gate that
passes such a model is broken."""
from __future__ import annotations

from typing import Any

import torch

from tally.errors import ConfigError
from tally.layers.dense import Fp16WeightLinear


@torch.no_grad()
def corrupt(llm: Any, spec: str) -> None:
    kind, _, arg = spec.partition(":")
    layers = llm.engine.model.layers
    if kind != "zero-layer" or not arg.isdigit() or int(arg) >= len(layers):
        raise ConfigError(f"--candidate-corrupt {spec!r}: write zero-layer:N with N in 0..{len(layers) - 1}")
    layer = layers[int(arg)]
    for t in [*layer.parameters(), *layer.buffers()]:
        if t.is_floating_point():
            t.zero_()
    for module in layer.modules():
        if isinstance(module, Fp16WeightLinear):  # packed weights: no parameter to zero
            module.zero_()
