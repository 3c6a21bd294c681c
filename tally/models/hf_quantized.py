"""GPTQ and AWQ checkpoints in Hugging Face's layout, read into Tally's int4 layers without re-quantizing.

Each projection becomes the tensors of a `tally quantize` w4a16 checkpoint (tally/models/packed_checkpoint.py): the
same integers, scale = s and zero = s * (8 - z), so (q - 8) * scale + zero is the stored weight exactly. GPTQ's
act-order (g_idx not k // group_size) interleaves groups over the inputs, which group-contiguous int4 layers cannot
hold: those projections are dequantized into dense fp32 weights (exact, without the memory saving), and the loader
says so.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from tally.errors import ModelLoadError
from tally.models.config import ModelConfig
from tally.models.families import read_hf_config
from tally.models.hf_checkpoint import (
    LOADING,
    expected_tensor_shapes,
    merged_eos_ids,
    read_header,
    weight_files,
)
from tally.models.packed_checkpoint import pack_int4
from tally.progress import Track

log = logging.getLogger(__name__)

# config.json's quantization_config names the method:
#   {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": false, "checkpoint_format": "gptq"}
#   {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": true, "version": "gemm"}
# Per projection P with K inputs, N outputs and G = K / group_size groups (group_size -1: one group):
#   GPTQ (AutoGPTQ, GPTQModel, optimum): P.qweight int32 [K/8, N], input 8r + j of column n in bits 4j of word
#     [r, n]; P.qzeros int32 [G, N/8], output 8c + j in bits 4j of word [g, c], stored as zero - 1 (the format's
#     historical offset) unless checkpoint_format is "gptq_v2"; P.scales fp16 [G, N]; P.g_idx int32 [K], the group
#     of each input.
#   AWQ (AutoAWQ, GEMM layout): P.qweight int32 [K, N/8] and P.qzeros int32 [G, N/8], 8 outputs per word with
#     output 8c + AWQ_ORDER[j] in bits 4j; P.scales fp16 [G, N]; the group of input k is k // group_size.
#   Both: w[n, k] = scales[g, n] * (q[k, n] - zero[g, n]), q and zero in 0..15.
METHODS = ("gptq", "awq")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
_AWQ_UNDO = tuple(AWQ_ORDER.index(j) for j in range(8))  # nibble that holds output 8c + j
_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)
Parts = dict[str, torch.Tensor]  # {suffix: tensor} of one projection


def reads(block: dict[str, Any]) -> bool:
    return block.get("quant_method") in METHODS


def _check_block(block: dict[str, Any], path: Path) -> None:
    method = block["quant_method"]
    if block.get("bits") != 4:
        raise ModelLoadError(f"{path}: {method} checkpoint with bits={block.get('bits')}; Tally reads 4-bit "
                             f"{method} checkpoints (or serve the unquantized model with --quantization int8)")
    if method == "awq" and str(block.get("version", "gemm")).lower() != "gemm":
        raise ModelLoadError(f"{path}: AWQ version {block.get('version')!r}; Tally reads AutoAWQ's GEMM layout")
    if method == "awq" and not block.get("zero_point", True):
        raise ModelLoadError(f"{path}: AWQ without zero points is not a layout Tally reads")


def _nibbles(words: torch.Tensor) -> torch.Tensor:
    """int32 [R, C] -> uint8 [R, C, 8]: nibble j is bits 4j..4j+3 of each word."""
    return ((words[..., None] >> _SHIFTS) & 15).to(torch.uint8)


def _unpack_outputs(words: torch.Tensor, awq: bool) -> torch.Tensor:
    """[R, N/8] words packed along the outputs -> uint8 [R, N]."""
    nib = _nibbles(words)
    if awq:
        nib = nib[..., list(_AWQ_UNDO)]
    return nib.reshape(words.shape[0], -1)


class HFQuantizedSource:
    """Streams a quantized HF checkpoint's tensors as a `tally quantize` checkpoint would hold them: dense tensors as
    stored, each packed projection through `convert` ({suffix: tensor} of its stored parts -> Tally's tensors)."""

    def __init__(self, files: list[Path], shapes: dict[str, tuple[int, ...]], packed: list[str],
                 suffixes: tuple[str, ...], convert: Callable[[dict[str, torch.Tensor]], Parts]) -> None:
        self._files, self._shapes, self._packed = files, shapes, packed
        self._suffixes, self._convert = suffixes, convert

    def tensors(self, track: Track) -> Iterator[tuple[str, torch.Tensor]]:
        handles = [safe_open(str(f), framework="pt") for f in self._files]
        where = {name: h for h in handles for name in h.keys()}
        dense_fallbacks = 0
        for name in track([*self._shapes, *self._packed], LOADING):  # dense tensors, then packed projections
            if name in self._shapes:
                yield name, where[name].get_tensor(name)
                continue
            parts = {s: where[f"{name}.{s}"].get_tensor(f"{name}.{s}")
                     for s in self._suffixes if f"{name}.{s}" in where}
            converted = self._convert(parts)
            dense_fallbacks += "weight" in converted
            for suffix, tensor in converted.items():
                yield f"{name}.{suffix}", tensor
        if dense_fallbacks:
            log.warning("%d projection(s) use act-order (g_idx): their groups interleave over the inputs, so they "
                        "are served dequantized (dense fp32, exact, no memory saving)", dense_fallbacks)


def in_groups(q: torch.Tensor, zero: torch.Tensor, scale: torch.Tensor,
              g_idx: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """q uint8 [N, K] in 0..15, zero and scale [N, G] with w = scale * (q - zero): a w4a16 projection's tensors, or
    the dense weight where g_idx [K] is not k // (K / G) (act-order)."""
    k = q.shape[1]
    if g_idx is not None and not torch.equal(g_idx.long(), torch.arange(k) // (k // scale.shape[1])):
        g = g_idx.long()
        return {"weight": scale[:, g] * (q.float() - zero[:, g])}
    return {"qweight": pack_int4(q), "scales": scale.contiguous(), "zeros": (scale * (8.0 - zero)).contiguous()}


def _convert(block: dict[str, Any], parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    awq = block["quant_method"] == "awq"
    if awq:
        q_kn = _unpack_outputs(parts["qweight"], True)
    else:  # 8 inputs per word: [K/8, N, 8] -> [K, N]
        words = parts["qweight"]
        q_kn = _nibbles(words).permute(0, 2, 1).reshape(words.shape[0] * 8, words.shape[1])
    z = _unpack_outputs(parts["qzeros"], awq).float()
    if not awq and block.get("checkpoint_format", "gptq") != "gptq_v2":
        z += 1
    return in_groups(q_kn.t(), z.t(), parts["scales"].float().t(), parts.get("g_idx"))


def open_hf_quantized(path: Path, block: dict[str, Any]) -> tuple[ModelConfig, HFQuantizedSource]:
    """Check config.json's block and every projection's packed shapes; dense tensors as in an HF checkpoint."""
    _check_block(block, path)
    config = read_hf_config(path / "config.json")
    config = dataclasses.replace(config, eos_token_ids=merged_eos_ids(config, path))
    awq = block["quant_method"] == "awq"
    dense, packed = split_projections(config, path, "qweight",
                                      lambda base, shape, found: _check_shapes(base, shape, found, block, awq, path))
    return config, HFQuantizedSource(weight_files(path)[0], dense, packed, ("qweight", "qzeros", "scales", "g_idx"),
                                     functools.partial(_convert, block))


def split_projections(config: ModelConfig, path: Path, marker: str,
                      check: Callable[[str, tuple[int, ...], dict[str, tuple[int, ...]]], None],
                      ) -> tuple[dict[str, tuple[int, ...]], list[str]]:
    """({dense tensor: shape}, [packed projection]) of a quantized checkpoint: a projection P is packed where
    P.`marker` is stored (`check` then checks its parts' shapes), else P.weight must be dense."""
    found = {name: shape for f in weight_files(path)[0] for name, (shape, _dtype) in read_header(f).items()}
    dense, packed = {}, []
    for name, shape in expected_tensor_shapes(config).items():
        base = name.removesuffix(".weight")
        if name.endswith(".weight") and f"{base}.{marker}" in found:
            check(base, shape, found)
            packed.append(base)
        elif found.get(name) == shape:
            dense[name] = shape
        elif not (name == "lm_head.weight" and config.tie_word_embeddings):
            have = found.get(name)
            raise ModelLoadError(f"{path}: tensor {name} is {'missing' if have is None else f'shaped {list(have)}'}"
                                 f"; expected {list(shape)} dense or {base}.{marker} packed")
    return dense, packed


def _check_shapes(base: str, shape: tuple[int, ...], found: dict, block: dict[str, Any], awq: bool,
                  path: Path) -> None:
    n, k = shape
    group = block.get("group_size", 128)
    groups = 1 if group in (-1, None) else k // group
    want = {"qweight": (k, n // 8) if awq else (k // 8, n), "qzeros": (groups, n // 8), "scales": (groups, n)}
    if not awq and f"{base}.g_idx" in found:
        want["g_idx"] = (k,)
    for suffix, expected in want.items():
        have = found.get(f"{base}.{suffix}")
        if have != expected or n % 8 or k % 8 or (group not in (-1, None) and k % group):
            raise ModelLoadError(
                f"{path}: {base}.{suffix} is {list(have) if have else 'missing'}, but a {block['quant_method']} "
                f"group-{group} layer of {k} inputs and {n} outputs stores it as {list(expected)}")
