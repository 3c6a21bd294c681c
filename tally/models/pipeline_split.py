"""Pipeline parallel: the contiguous run of layers each stage holds, and so which checkpoint tensors it loads.

The one rule the engine and `tally plan` (tally/ledger/parallel.py) share: layer l goes to stage l * pp // layers,
so stage 0 gets ceil(layers / pp) layers, the most of any stage (its KV pool is the largest and the block count it
sizes fits every stage). Stage 0 also holds the embedding; the last stage the final norm and the LM head, which is
its own copy of the embedding when the two are tied.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from tally.errors import ConfigError
from tally.models.config import ModelConfig

_LAYER = re.compile(r"model\.layers\.(\d+)\.")


@dataclass(frozen=True)
class PPStage:
    """Stage `stage` of `size`: layers [layers[0], layers[1])."""

    stage: int
    size: int
    layers: tuple[int, int]
    tied: bool  # the LM head is the embedding: the last stage keeps a copy of it

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.size - 1

    @property
    def num_layers(self) -> int:
        return self.layers[1] - self.layers[0]

    def holds(self, name: str) -> bool:
        """Whether HF tensor `name` belongs to this stage."""
        layer = _LAYER.match(name)
        if layer is not None:
            return self.layers[0] <= int(layer.group(1)) < self.layers[1]
        if name == "model.embed_tokens.weight":
            return self.first or (self.last and self.tied)
        if name == "model.norm.weight" or name.startswith("lm_head."):
            return self.last
        return True  # e.g. rotary tables, which the builder ignores


def stage_of_layer(layer: int, num_layers: int, pp: int) -> int:
    return layer * pp // num_layers


def plan_stages(cfg: ModelConfig, pp: int) -> list[PPStage]:
    """Every stage's layers, or ConfigError when the model cannot be split `pp` ways."""
    if not 1 <= pp <= cfg.num_layers:
        raise ConfigError(f"{pp} pipeline stages cannot split the model's {cfg.num_layers} layers (a stage holds at "
                          f"least one): choose a pipeline parallel size from 1 to {cfg.num_layers}",
                          param="pipeline_parallel_size")
    # the first layer of stage s: the smallest l with l * pp // n == s
    bounds = [-(-s * cfg.num_layers // pp) for s in range(pp + 1)]
    return [PPStage(s, pp, (bounds[s], bounds[s + 1]), cfg.tie_word_embeddings) for s in range(pp)]
