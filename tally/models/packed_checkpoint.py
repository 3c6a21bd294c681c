"""How the loader reads the checkpoint `tally quantize` writes (tally/quantize/writer.py); format: docs/quantization.md.

An HF directory: config.json with a `quantization_config` block ({"quant_method": "tally", "scheme": ...}),
tokenizer files, one model.safetensors. A quantized projection `P` is stored as
  w4a16: P.qweight uint8 [N, K/2] (byte j of a row: column 2j in the low nibble, 2j+1 in the high),
         P.scales fp16 [N, K/g], P.zeros fp16 [N, K/g];  w = (q - 8) * scale + zero, g = K / scales.shape[1]
  w8a16, w8a8: P.qweight int8 [N, K], P.scales fp16 [N];  w = q * scale
Projections kept in high precision, embeddings, norms and lm_head are ordinary `.weight` tensors.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from tally.errors import ModelLoadError
from tally.layers.linear import int4_linear, int8_linear, w8a8_linear
from tally.models.config import ModelConfig
from tally.models.families import read_hf_config
from tally.models.hf_checkpoint import LOADING, SINGLE_FILE, expected_tensor_shapes
from tally.progress import Track

QUANT_METHOD = "tally"
SCHEMES = ("w4a16", "w8a16", "w8a8")


def quantization_block(path: Path) -> dict[str, Any] | None:
    """config.json's quantization_config; None when there is none (or the config is unreadable: the HF opener
    reports that)."""
    try:
        block = json.loads((path / "config.json").read_text()).get("quantization_config")
    except (OSError, json.JSONDecodeError):
        return None
    return block or None


def packed_scheme(path: Path) -> str | None:
    """The scheme of a checkpoint directory `tally quantize` wrote, None for an ordinary HF checkpoint."""
    block = quantization_block(path)
    if block is None:
        return None
    if block.get("quant_method") != QUANT_METHOD or block.get("scheme") not in SCHEMES:
        raise ModelLoadError(
            f"{path}/config.json has a quantization_config Tally does not read ({block.get('quant_method')!r}); "
            "Tally reads `tally quantize` checkpoints, 4-bit GPTQ / AWQ ones and compressed-tensors' integer ones; "
            "otherwise serve the unquantized checkpoint, or quantize it with `tally quantize`")
    return block["scheme"]


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    q = q.to(torch.uint8)
    return (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    out = torch.empty(packed.shape[0], packed.shape[1] * 2, dtype=torch.uint8)
    out[:, 0::2], out[:, 1::2] = packed & 15, packed >> 4
    return out


class PackedTensorSource:
    def __init__(self, file: Path, names: list[str]) -> None:
        self._file, self._names = file, names

    def tensors(self, track: Track) -> Iterator[tuple[str, torch.Tensor]]:
        with safe_open(str(self._file), framework="pt") as f:
            for name in track(self._names, LOADING):
                yield name, f.get_tensor(name)


def open_packed(path: Path) -> tuple[ModelConfig, PackedTensorSource]:
    """Parse config.json and check that every projection is either dense or packed with consistent shapes."""
    config = read_hf_config(path / "config.json")
    scheme = packed_scheme(path)
    file = path / SINGLE_FILE
    try:
        with safe_open(str(file), framework="pt") as f:
            shapes = {n: tuple(f.get_slice(n).get_shape()) for n in f.keys()}
    except (SafetensorError, FileNotFoundError, OSError) as exc:
        raise ModelLoadError(f"{file} is missing or unreadable ({exc}); re-run `tally quantize`") from exc
    for name, shape in expected_tensor_shapes(config).items():
        if shapes.get(name) == shape:
            continue
        base = name.removesuffix(".weight")
        if name.endswith(".weight") and f"{base}.qweight" in shapes:
            _check_packed(base, shape, shapes, scheme, file)
        elif not (name == "lm_head.weight" and config.tie_word_embeddings):
            found = shapes.get(name)
            raise ModelLoadError(f"{file}: tensor {name} is {'missing' if found is None else f'shaped {list(found)}'}"
                                 f"; expected {list(shape)} dense or {base}.qweight packed")
    return config, PackedTensorSource(file, list(shapes))


def _check_packed(base: str, shape: tuple[int, ...], shapes: dict, scheme: str, file: Path) -> None:
    n, k = shape
    qweight, scales = shapes.get(f"{base}.qweight"), shapes.get(f"{base}.scales")
    if scheme == "w4a16":
        groups = scales[1] if scales and len(scales) == 2 else 0
        ok = (qweight == (n, k // 2) and groups and k % groups == 0 and shapes.get(f"{base}.zeros") == scales)
    else:
        ok = qweight == (n, k) and scales == (n,)
    if not ok:
        raise ModelLoadError(f"{file}: packed tensors of {base} ({scheme}) do not fit its [{n}, {k}] weight; "
                             "the file is damaged or was not written by `tally quantize`")


def linear_from_packed(scheme: str, parts: list[dict[str, torch.Tensor]], bias: torch.Tensor | None,
                       dtype: torch.dtype) -> nn.Module:
    """One layer over the rows of every part (a fused projection), exactly as stored."""
    scales = torch.cat([p["scales"].float() for p in parts])
    if scheme == "w4a16":
        q = torch.cat([unpack_int4(p["qweight"]) for p in parts])
        zeros = torch.cat([p["zeros"].float() for p in parts])
        return int4_linear(q, scales, zeros, q.shape[1] // scales.shape[1], bias, dtype)
    q = torch.cat([p["qweight"] for p in parts])
    if scheme == "w8a8":
        return w8a8_linear(q, scales, bias, dtype)
    return int8_linear(q, scales, bias, dtype)
