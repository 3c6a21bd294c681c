"""A PEFT LoRA adapter read and checked against the base model: per layer and fused projection (qkv, o, gate_up,
down), A stacked over its targeted parts [r_site, in] and B block-diagonal [out, r_site] with the scale folded in, so
a projection's delta is two matmuls. What Tally does not implement is refused by name, with what to change."""
from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from tally.errors import InvalidRequestError
from tally.models.config import ModelConfig

# Tally's fused projection → the HF modules it holds, in its row order
SITES: dict[str, tuple[str, ...]] = {"qkv": ("q_proj", "k_proj", "v_proj"), "o": ("o_proj",),
                                     "gate_up": ("gate_proj", "up_proj"), "down": ("down_proj",)}
TARGETS = tuple(m for parts in SITES.values() for m in parts)
_KEY = re.compile(r"^base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")


@dataclass
class LoRAAdapter:
    name: str
    path: str
    rank: int
    # (layer, site) → (A [r_site, in], B [out, r_site]); a site no part of which is targeted is absent
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]
    key: str  # digest of the config and weights: names the adapter in the prefix cache's block hashes

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.weights.values())


def adapter_bytes_at_rank(cfg: ModelConfig, rank: int, dtype: torch.dtype) -> int:
    """The memory an adapter of `rank` targeting every projection of every layer takes (as held: B block-diagonal)."""
    h, i, q, kv = cfg.hidden_size, cfg.intermediate_size, cfg.q_size, cfg.kv_size
    per_layer = (3 * rank * h + (q + 2 * kv) * 3 * rank) + (rank * q + h * rank) \
        + (2 * rank * h + 2 * i * 2 * rank) + (rank * i + h * rank)
    return per_layer * cfg.num_layers * dtype.itemsize


def load_adapter(name: str, path: str, cfg: ModelConfig, max_rank: int, dtype: torch.dtype) -> LoRAAdapter:
    folder = Path(path)
    config_file, weights_file = folder / "adapter_config.json", folder / "adapter_model.safetensors"
    if not config_file.is_file():
        raise bad(f"LoRA adapter {name!r}: {path} has no adapter_config.json; give the folder PEFT's "
                  "save_pretrained wrote, or the .gguf file llama.cpp's convert_lora_to_gguf.py wrote")
    if not weights_file.is_file():
        also = " (adapter_model.bin is not read: save it with safe_serialization=True)" \
            if (folder / "adapter_model.bin").is_file() else ""
        raise bad(f"LoRA adapter {name!r}: {path} has no adapter_model.safetensors{also}")
    raw_config = config_file.read_bytes()
    try:
        conf = json.loads(raw_config)
    except ValueError as exc:
        raise bad(f"LoRA adapter {name!r}: adapter_config.json is not valid JSON: {exc}") from None
    raw_weights = weights_file.read_bytes()
    try:
        tensors = load_file(str(weights_file))
    except Exception as exc:  # noqa: BLE001 - safetensors' own message says what is wrong with the file
        raise bad(f"LoRA adapter {name!r}: adapter_model.safetensors cannot be read: {exc}") from None
    return adapter_from(name, path, conf, tensors, raw_config + raw_weights, cfg, max_rank, dtype)


def adapter_from(name: str, path: str, conf: dict, tensors: dict[str, torch.Tensor], digest_of: bytes,
                 cfg: ModelConfig, max_rank: int, dtype: torch.dtype) -> LoRAAdapter:
    """The adapter of PEFT's adapter_config.json settings and tensors (under PEFT's names), checked against the base;
    `digest_of` (the bytes it was read from) names it."""
    rank, scale = _check_config(name, conf, max_rank)
    parts = _parts(name, tensors, cfg, rank)
    weights = {}
    for layer in range(cfg.num_layers):
        for site, modules in SITES.items():
            targeted = [m for m in modules if any((ly, m) in parts for ly in range(cfg.num_layers))]
            if not targeted:
                continue
            if site in ("gate_up", "down") and cfg.is_moe_layer(layer):
                raise bad(f"LoRA adapter {name!r} targets {', '.join(targeted)}, but layer {layer} of this model "
                          "is a mixture of experts; LoRA on experts is not supported: target attention only")
            ins, outs = site_shapes(cfg, site)
            a = torch.zeros(rank * len(targeted), ins, dtype=dtype)
            b = torch.zeros(sum(outs[modules.index(m)] for m in modules), rank * len(targeted), dtype=dtype)
            row_starts = [sum(outs[:j]) for j in range(len(modules))]
            for j, m in enumerate(targeted):
                if (layer, m) not in parts:
                    continue  # layers_to_transform: this layer's part stays zero
                part_a, part_b = parts[(layer, m)]
                k = modules.index(m)
                a[j * rank:(j + 1) * rank] = part_a
                b[row_starts[k]:row_starts[k] + outs[k], j * rank:(j + 1) * rank] = part_b * scale
            weights[(layer, site)] = (a, b)
    key = hashlib.blake2b(digest_of, digest_size=16).hexdigest()
    return LoRAAdapter(name, path, rank, weights, key)


def _check_config(name: str, conf: dict, max_rank: int) -> tuple[int, float]:
    """(rank, scale) from adapter_config.json, or what it asks that is not implemented, refused by name."""
    if conf.get("peft_type", "LORA") != "LORA":
        raise bad(f"LoRA adapter {name!r} is a {conf.get('peft_type')} adapter; only LORA is served")
    if conf.get("use_dora"):
        raise bad(f"LoRA adapter {name!r} uses DoRA (use_dora), which is not supported; merge it into the base "
                  "model (merge_and_unload) and serve that")
    if conf.get("modules_to_save"):
        raise bad(f"LoRA adapter {name!r} saves whole modules (modules_to_save: {conf['modules_to_save']}), which is "
                  "not supported; train without modules_to_save, or merge it and serve the merged model")
    for field in ("rank_pattern", "alpha_pattern"):
        if conf.get(field):
            raise bad(f"LoRA adapter {name!r} sets {field}; per-module ranks and alphas are not supported: train "
                      "with one r and lora_alpha")
    if conf.get("fan_in_fan_out"):
        raise bad(f"LoRA adapter {name!r} sets fan_in_fan_out (Conv1D layers); only nn.Linear targets are served")
    if conf.get("bias", "none") != "none" or conf.get("lora_bias"):
        raise bad(f"LoRA adapter {name!r} trains biases (bias / lora_bias); only adapters without biases are served")
    targets = conf.get("target_modules") or []
    # a regex names its modules through the tensors, which _parts checks one by one
    other = [] if isinstance(targets, str) else [t for t in targets if t not in TARGETS]
    if other:
        raise bad(f"LoRA adapter {name!r} targets {other}; Tally applies LoRA to {', '.join(TARGETS)} only "
                  "(embedding and lm_head targets are not supported)")
    rank = conf.get("r")
    if not isinstance(rank, int) or rank < 1:
        raise bad(f"LoRA adapter {name!r}: adapter_config.json's r must be a positive integer, got {rank!r}")
    if rank > max_rank:
        raise bad(f"LoRA adapter {name!r} has rank {rank} but --max-lora-rank is {max_rank}; start the server with "
                  f"--max-lora-rank ≥ {rank}")
    alpha = conf.get("lora_alpha", 8)
    scale = alpha / math.sqrt(rank) if conf.get("use_rslora") else alpha / rank
    return rank, scale


def _parts(name: str, tensors: dict[str, torch.Tensor], cfg: ModelConfig,
           rank: int) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    """(layer, module) → (A [r, in], B [out, r]), every tensor of the file accounted for and its shape checked."""
    found: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        m = _KEY.match(key)
        if m is None or m.group(3) not in TARGETS:
            raise bad(f"LoRA adapter {name!r} holds tensor {key!r}, which is not a LoRA A/B of a "
                      f"{'/'.join(TARGETS)} projection of a decoder layer; only those are served")
        layer = int(m.group(1))
        if layer >= cfg.num_layers:
            raise bad(f"LoRA adapter {name!r} has weights for layer {layer}, but the base model has "
                      f"{cfg.num_layers} layers: it was trained on another model")
        found.setdefault((layer, m.group(3)), {})[m.group(4)] = t
    if not found:
        raise bad(f"LoRA adapter {name!r}: adapter_model.safetensors holds no LoRA weights")
    parts = {}
    for (layer, module), ab in found.items():
        if set(ab) != {"A", "B"}:
            raise bad(f"LoRA adapter {name!r}: layer {layer} {module} has lora_{''.join(ab)} without its pair")
        site = next(s for s, mods in SITES.items() if module in mods)
        ins, outs = site_shapes(cfg, site)
        want_a, want_b = (rank, ins), (outs[SITES[site].index(module)], rank)
        if tuple(ab["A"].shape) != want_a or tuple(ab["B"].shape) != want_b:
            raise bad(f"LoRA adapter {name!r}: layer {layer} {module} has A {list(ab['A'].shape)} and B "
                      f"{list(ab['B'].shape)}, but this base model with r={rank} needs A {list(want_a)} and B "
                      f"{list(want_b)}: the adapter was trained on another model (or its r is wrong)")
        parts[(layer, module)] = (ab["A"].float(), ab["B"].float())
    return parts


def site_shapes(cfg: ModelConfig, site: str) -> tuple[int, list[int]]:
    """(in features, out features of each part) of a fused projection."""
    h = cfg.hidden_size
    return {"qkv": (h, [cfg.q_size, cfg.kv_size, cfg.kv_size]), "o": (cfg.q_size, [h]),
            "gate_up": (h, [cfg.intermediate_size] * 2), "down": (cfg.intermediate_size, [h])}[site]


def bad(message: str) -> InvalidRequestError:
    """What an adapter that cannot be served is refused with: a 400 naming lora_path."""
    return InvalidRequestError(message, param="lora_path")
