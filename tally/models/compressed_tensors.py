"""Checkpoints in compressed-tensors' format (llm-compressor's, the one vLLM reads), read into Tally's int4, int8 and
W8A8 layers without re-quantizing: W4A16 and W8A16 (group or channel scales) and W8A8 int8 (channel weights, dynamic
per-token activations). Every other scheme is refused by the config.json field that names it.
"""
from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import torch

from tally.errors import ModelLoadError
from tally.layers.linear import INT4_GROUP_SIZES
from tally.models.config import ModelConfig
from tally.models.families import read_hf_config
from tally.models.hf_checkpoint import merged_eos_ids, weight_files
from tally.models.hf_quantized import HFQuantizedSource, in_groups, split_projections

# config.json's quantization_config (written by compressed_tensors' ModelCompressor.update_config):
#   {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {"targets":
#    ["Linear"], "weights": {"type": "int", "num_bits": 4, "strategy": "group", "group_size": 128, "symmetric": true,
#    "dynamic": false, "actorder": null}, "input_activations": null}}, "ignore": ["lm_head"], "kv_cache_scheme": null,
#    "sparsity_config": {}, "transform_config": {}}
# Per projection P with N outputs, K inputs and G groups (1 for strategy "channel"); q is signed, w = s * (q - zp):
#   pack-quantized: P.weight_packed int32 [N, K * bits / 32], element 32/bits * c + j of a row in bits [bits * j,
#     bits * (j + 1)) of word c, stored as q + 2**(bits - 1); P.weight_zero_point (asymmetric only) int32
#     [N * bits / 32, G], packed the same way down the outputs; P.weight_shape int64 [2] = (N, K).
#   int-quantized / naive-quantized: P.weight int8 [N, K] = q; P.weight_zero_point int8 [N, G] where asymmetric.
#   All: P.weight_scale [N, G] in the model's dtype; P.weight_g_idx int32 [K] (actorder "group"), the group of each
#   input.
METHOD = "compressed-tensors"
FORMATS = ("pack-quantized", "int-quantized", "naive-quantized")
SUFFIXES = ("weight_packed", "weight", "weight_scale", "weight_zero_point", "weight_g_idx")
_READS = ("Tally reads integer W4A16 / W8A16 (group or channel weights) and W8A8 int8 (channel weights, dynamic "
          "per-token activations) in the formats " + ", ".join(FORMATS))


def reads(block: dict[str, Any]) -> bool:
    return block.get("quant_method") == METHOD


@dataclasses.dataclass(frozen=True)
class Weights:
    bits: int
    group_size: int | None  # None: one scale per output channel
    symmetric: bool


def _refuse(path: Path, field: str, value: Any, what: str) -> ModelLoadError:
    return ModelLoadError(f"{path}/config.json: quantization_config.{field} is {value!r} ({what}); {_READS}; "
                          "otherwise serve the unquantized checkpoint")


def _check_block(block: dict[str, Any], path: Path) -> tuple[str, Weights]:
    """The Tally scheme (w4a16, w8a16, w8a8) every config group maps to, and its weights' layout."""
    for field, what in (("sparsity_config", "sparse weights, e.g. 2:4"), ("transform_config", "rotated weights"),
                        ("kv_cache_scheme", "a quantized KV cache; Tally's own is --kv-cache-dtype int8")):
        if block.get(field) not in (None, {}) and (block[field] or {}).get("format", "") != "dense":
            raise _refuse(path, field, block[field], what)
    groups = block.get("config_groups") or {}
    if not groups:
        raise _refuse(path, "config_groups", groups, "no quantized layers")
    found = {_check_group(f"config_groups.{name}", group, block, path) for name, group in groups.items()}
    if len(found) > 1:
        raise _refuse(path, "config_groups", sorted(groups), "layers quantized in different schemes; Tally serves "
                      "one scheme a model")
    return found.pop()


def _check_group(where: str, group: dict[str, Any], block: dict[str, Any], path: Path) -> tuple[str, Weights]:
    fmt = group.get("format") or block.get("format")
    if fmt not in FORMATS:
        raise _refuse(path, f"{where}.format" if group.get("format") else "format", fmt, "not an integer layout")
    w = group.get("weights") or {}
    checks = [("type", w.get("type") == "int", "floating-point weights: FP8, NVFP4, MXFP4"),
              ("num_bits", w.get("num_bits") in (4, 8), "Tally's integer layers hold 4 or 8 bits"),
              ("strategy", w.get("strategy") in ("group", "channel"), "one scale per group or per output channel"),
              ("dynamic", not w.get("dynamic"), "weights quantized at run time"),
              ("symmetric", w.get("symmetric", True) or w.get("num_bits") == 4, "Tally's int8 layers are symmetric")]
    if w.get("strategy") == "group":
        sizes = INT4_GROUP_SIZES if w.get("num_bits") == 4 else (32, 64, 128, 256)
        checks.append(("group_size", w.get("group_size") in sizes, f"groups of {', '.join(map(str, sizes))} read"))
    elif w.get("num_bits") == 4:
        checks.append(("strategy", False, "Tally's int4 layers take groups of 32, 64 or 128 inputs"))
    for field, ok, what in checks:
        if not ok:
            raise _refuse(path, f"{where}.weights.{field}", w.get(field), what)
    weights = Weights(w["num_bits"], w.get("group_size") if w["strategy"] == "group" else None,
                      w.get("symmetric", True))
    if group.get("output_activations"):
        raise _refuse(path, f"{where}.output_activations", group["output_activations"], "quantized outputs")
    acts = group.get("input_activations")
    if not acts:
        return f"w{weights.bits}a16", weights
    w8a8 = {"type": "int", "num_bits": 8, "strategy": "token", "dynamic": True, "symmetric": True}
    for field, want in w8a8.items():
        if acts.get(field, True if field == "symmetric" else None) != want:
            what = "static activation scales" if field == "dynamic" else f"Tally's W8A8 takes {field} {want!r}"
            raise _refuse(path, f"{where}.input_activations.{field}", acts.get(field), what)
    if weights.bits != 8 or weights.group_size is not None:
        raise _refuse(path, f"{where}.weights", w, "W8A8 takes int8 weights with one scale per output channel")
    return "w8a8", weights


def _unpack(words: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 [R, C] packed along the rows -> int16 [R, C * 32 / bits], the offset taken off (signed values)."""
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    values = (words[..., None] >> shifts) & ((1 << bits) - 1)
    return (values.reshape(words.shape[0], -1) - (1 << (bits - 1))).to(torch.int16)


def _convert(weights: Weights, parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    scale = parts["weight_scale"].float()
    if "weight_packed" in parts:
        q = _unpack(parts["weight_packed"], weights.bits)
    else:
        q = parts["weight"].to(torch.int16)
    zp = parts.get("weight_zero_point")
    if zp is not None and zp.dtype == torch.int32:  # pack-quantized: packed down the outputs
        zp = _unpack(zp.t().contiguous(), weights.bits).t()
    zero = torch.zeros_like(scale) if zp is None else zp.float()
    g_idx = parts.get("weight_g_idx")
    if weights.bits == 4:  # unsigned nibbles: w = s * ((q + 8) - (zp + 8))
        return in_groups((q + 8).to(torch.uint8), zero + 8, scale, g_idx)
    groups = scale.shape[1]
    if g_idx is not None and not torch.equal(g_idx.long(), torch.arange(q.shape[1]) // (q.shape[1] // groups)):
        return {"weight": scale[:, g_idx.long()] * q.float()}
    return {"qweight": q.to(torch.int8), "scales": scale.squeeze(1) if groups == 1 else scale}


def _check_shapes(base: str, shape: tuple[int, ...], found: dict[str, tuple[int, ...]], weights: Weights,
                  path: Path) -> None:
    n, k = shape
    group = weights.group_size or k
    want = {"weight_scale": (n, k // group)}
    if f"{base}.weight_packed" in found:
        want["weight_packed"] = (n, k * weights.bits // 32)
        if not weights.symmetric:
            want["weight_zero_point"] = (n * weights.bits // 32, k // group)
    else:
        want["weight"] = (n, k)
        if not weights.symmetric:
            want["weight_zero_point"] = (n, k // group)
    if f"{base}.weight_g_idx" in found:
        want["weight_g_idx"] = (k,)
    for suffix, expected in want.items():
        have = found.get(f"{base}.{suffix}")
        if have != expected or (k * weights.bits) % 32 or (n * weights.bits) % 32:
            raise ModelLoadError(f"{path}: {base}.{suffix} is {list(have) if have else 'missing'}, but a "
                                 f"compressed-tensors {weights.bits}-bit layer of {k} inputs and {n} outputs in "
                                 f"groups of {group} stores it as {list(expected)}")


def open_compressed_tensors(path: Path, block: dict[str, Any]) -> tuple[ModelConfig, HFQuantizedSource, str]:
    """Check config.json's block and every projection's stored shapes; the Tally scheme the layers load as."""
    scheme, weights = _check_block(block, path)
    config = read_hf_config(path / "config.json")
    config = dataclasses.replace(config, eos_token_ids=merged_eos_ids(config, path))
    dense, packed = split_projections(config, path, "weight_scale",
                                      lambda base, shape, found: _check_shapes(base, shape, found, weights, path))
    source = HFQuantizedSource(weight_files(path)[0], dense, packed, SUFFIXES,
                               functools.partial(_convert, weights))
    return config, source, scheme
