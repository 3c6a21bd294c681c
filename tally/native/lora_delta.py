"""A step's LoRA adapters as the native kernels read them (tally/native/lora_delta.h): the ctypes mirrors of its
structs, filled once per set of adapters from the stacks tally/layers/lora.py builds, and the per-row delta of one
projection for the layer-by-layer path (the one-call decode step adds it itself, given `address`)."""
from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence

import torch

from tally.native.library import load
from tally.native.ops import KV_KINDS

_P, _I = ctypes.c_void_p, ctypes.c_int64
SITES = ("qkv", "o", "gate_up", "down")  # lora_delta.h's LORA_* order


class _LoraSite(ctypes.Structure):
    _fields_ = [("a", _P), ("bt", _P), ("cols", _P), ("spans", _P), ("k", _I), ("n", _I)]


class _Lora(ctypes.Structure):
    _fields_ = [("layers", _I), ("slots", _I), ("kind", _I), ("row_slot", _P), ("sites", ctypes.POINTER(_LoraSite))]


# (layer, site) → (A [R, in], B^T [R, out], each slot's [first, end) rows of them): the step's adapters stacked
Stacks = Mapping[tuple[int, str], tuple[torch.Tensor, torch.Tensor, Sequence[tuple[int, int]]]]


class NativeLoRA:
    """The stacks described to C; `rows` sets each row's adapter for a step. The struct points into the stacks'
    tensors, which it holds."""

    def __init__(self, stacks: Stacks, slots: int) -> None:
        layers = 1 + max(layer for layer, _ in stacks)
        self._sites = (_LoraSite * (layers * len(SITES)))()
        self._keep: list[torch.Tensor] = []
        for (layer, site), (a, bt, spans) in stacks.items():
            cols, spans = _nonzero_columns(bt), torch.tensor(spans, dtype=torch.int64).reshape(-1, 2)
            self._keep += [a, bt, cols, spans]
            self._sites[layer * len(SITES) + SITES.index(site)] = _LoraSite(
                a.data_ptr(), bt.data_ptr(), cols.data_ptr(), spans.data_ptr(), a.shape[1], bt.shape[1])
        dtype = next(iter(stacks.values()))[0].dtype
        self._lora = _Lora(layers, slots, KV_KINDS[dtype], None, self._sites)
        self._rows = torch.empty(0, dtype=torch.int64)
        self.address = ctypes.addressof(self._lora)

    def rows(self, row_slots: torch.Tensor) -> None:
        """Each flat row's adapter slot for the coming step [T], -1 for the base."""
        self._rows = row_slots.to(torch.int64).contiguous()
        self._lora.row_slot = self._rows.data_ptr()

    def add(self, layer: int, site: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """y [T, out] plus each row's delta of x [T, in], computed in fp32 (y updated in place and returned)."""
        x32 = x.to(torch.float32).contiguous()
        y32 = y if y.dtype == torch.float32 and y.is_contiguous() else y.to(torch.float32).contiguous()
        load().tally_lora_add(self.address, layer * len(SITES) + SITES.index(site), x32.data_ptr(), y32.data_ptr(),
                              len(x32))
        if y32 is not y:
            y.copy_(y32)
        return y


def _nonzero_columns(bt: torch.Tensor) -> torch.Tensor:
    """[R, 2]: each row's first and past-the-last nonzero column ([0, 0) for a zero row). B is block-diagonal over a
    fused projection's parts, so a row's zeros outside its part are never read."""
    nonzero = bt != 0
    first = nonzero.to(torch.uint8).argmax(1)
    end = bt.shape[1] - nonzero.flip(1).to(torch.uint8).argmax(1)
    anything = nonzero.any(1)
    return torch.stack([torch.where(anything, first, 0), torch.where(anything, end, 0)], 1).to(torch.int64)
