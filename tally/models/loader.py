"""The one entry point for weights: `load_checkpoint(model)` resolves the name, reads and checks
the headers (config, tensor names and shapes, file lengths), and streams tensors on demand
under HF names, whatever the file format."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch

from tally.models import compressed_tensors
from tally.models.config import ModelConfig
from tally.models.gguf_checkpoint import GGUF_LOADING, GGUFRawTensor, GGUFTensorSource, open_gguf
from tally.models.hf_checkpoint import HFTensorSource, open_hf
from tally.models.hf_quantized import HFQuantizedSource, open_hf_quantized, reads
from tally.models.packed_checkpoint import (
    PackedTensorSource,
    open_packed,
    packed_scheme,
    quantization_block,
)
from tally.models.registry import resolve_model
from tally.models.tensor_map import TensorMap
from tally.progress import Track, untracked

__all__ = ["Checkpoint", "GGUFRawTensor", "load_checkpoint"]


@dataclass(frozen=True)
class Checkpoint:
    path: Path  # the checkpoint directory (hf) or file (gguf)
    name: str  # the model name the server reports
    config: ModelConfig
    format: str  # "hf" or "gguf"
    _source: HFTensorSource | GGUFTensorSource | PackedTensorSource | HFQuantizedSource = field(repr=False)
    # scheme of a pre-quantized checkpoint (w4a16, w8a16, w8a8): written by `tally quantize`, GPTQ / AWQ read as
    # w4a16 (tally/models/hf_quantized.py), or compressed-tensors' (tally/models/compressed_tensors.py)
    quantization: str | None = None

    def tensors(self, track: Track = untracked) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, tensor) one at a time, in the file's dtype (quantized GGUF types → float32; a `tally
        quantize` checkpoint yields its packed `*.qweight`, `*.scales`, `*.zeros` as stored).
        Tied checkpoints yield no lm_head.weight. `track` shows the reading (and dequantizing) going on, out of a
        total the headers give (tally/progress.py: on_stderr)."""
        return self._source.tensors(track)

    def tensor_map(self, track: Track, keep: Callable[[str], bool],
                   cut: Callable[[str, torch.Tensor], torch.Tensor] | None) -> TensorMap:
        """The tensors `keep` selects, for the model builder, each through `cut` (a rank's slice) as it is read. A
        GGUF's are read when the builder takes them, so blocks served as stored are never dequantized; other formats
        stream in file order, read here."""
        if isinstance(self._source, GGUFTensorSource):
            names = [n for n in self._source.names() if keep(n)]
            return TensorMap({n: partial(_read_cut, self._source.read, cut, n) for n in names},
                             iter(track(names, GGUF_LOADING)))
        return TensorMap.of({n: t if cut is None else cut(n, t) for n, t in self.tensors(track) if keep(n)})

    def gguf_tensor(self, hf_name: str) -> GGUFRawTensor | None:
        """The stored blocks of one tensor (GGUF only; q/k rows un-permuted), else None."""
        if isinstance(self._source, GGUFTensorSource):
            return self._source.raw(hf_name)
        return None


def _read_cut(read: Callable[[str], torch.Tensor], cut: Callable[[str, torch.Tensor], torch.Tensor] | None,
              name: str) -> torch.Tensor:
    tensor = read(name)
    return tensor if cut is None else cut(name, tensor)


def load_checkpoint(model: str | None) -> Checkpoint:
    """None or "smollm2-135m" → the built-in GGUF; a directory with config.json → HF; a .gguf file."""
    location = resolve_model(model)
    block = quantization_block(location.path) if location.format == "hf" else None
    if block is not None and reads(block):
        config, hf_source = open_hf_quantized(location.path, block)
        return Checkpoint(location.path, location.name, config, location.format, hf_source, "w4a16")
    if block is not None and compressed_tensors.reads(block):
        config, hf_source, scheme = compressed_tensors.open_compressed_tensors(location.path, block)
        return Checkpoint(location.path, location.name, config, location.format, hf_source, scheme)
    scheme = packed_scheme(location.path) if location.format == "hf" else None
    opener = open_gguf if location.format == "gguf" else (open_packed if scheme else open_hf)
    config, source = opener(location.path)
    return Checkpoint(location.path, location.name, config, location.format, source, scheme)
