"""A mixture of experts' MLP in one native call (tally/native/experts.h): the router, top-k routing and each chosen
expert's projections over the rows that chose it, on the formats the experts are stored in (a GGUF's blocks as the
file holds them). Each row is routed and computed on its own, so a token's output never depends on its batch; the
one-call decode step runs the same struct inside its layers."""
from __future__ import annotations

import ctypes
from typing import Protocol

import torch
from torch import nn

from tally.models.native_decode_step import _I, _P, _Proj, _proj
from tally.native.library import load
from tally.native.ops import ACTIVATIONS

ROUTINGS = {"softmax": 0, "top_k_softmax": 1}  # experts.h: ROUTE_SOFTMAX, ROUTE_TOP_K_SOFTMAX


class ExpertLayers(Protocol):
    """What the call reads of tally/models/experts.py's MixtureOfExperts."""

    top_k: int
    normalize: bool
    routing: str
    activation_name: str
    swiglu: tuple[float, float]  # clamped SwiGLU's alpha and limit
    router: torch.Tensor  # [E, H]
    router_bias: torch.Tensor | None
    gate_up: nn.ModuleList
    down: nn.ModuleList


class _Experts(ctypes.Structure):
    _fields_ = [("num_experts", _I), ("top_k", _I), ("hidden", _I), ("intermediate", _I), ("routing", _I),
                ("normalize", _I), ("activation", _I), ("router", _P), ("router_bias", _P),
                ("gate_up", ctypes.POINTER(_Proj)), ("down", ctypes.POINTER(_Proj)), ("swiglu_alpha", ctypes.c_float),
                ("swiglu_limit", ctypes.c_float)]


class NativeExperts:
    """The experts described to C once, from the loaded weights' pointers (never replaced after loading)."""

    def __init__(self, struct: _Experts, keep: list[ctypes.Array[_Proj]]) -> None:
        self.struct = struct
        self._keep = keep  # the Proj arrays (and concatenated projections' parts) the struct points at

    @classmethod
    def build(cls, moe: ExpertLayers) -> NativeExperts | None:
        """None (the PyTorch loop runs) unless the kernels are loaded, the router is fp32, the activation is one the
        kernels compute and every expert projection is a native layer (tally/quant/native_linear.py) or fp16
        panels."""
        if (load() is None or moe.activation_name not in ACTIVATIONS or moe.routing not in ROUTINGS
                or moe.router.dtype != torch.float32 or not moe.router.is_contiguous()):
            return None
        keep: list[ctypes.Array[_Proj]] = []
        gate_up, down = ([_proj(m, keep) for m in modules] for modules in (moe.gate_up, moe.down))
        if any(p is None for p in gate_up + down):
            return None
        arrays = [(_Proj * len(projs))(*projs) for projs in (gate_up, down)]
        keep += arrays
        bias = None if moe.router_bias is None else moe.router_bias.data_ptr()
        struct = _Experts(len(gate_up), moe.top_k, moe.router.shape[1], gate_up[0].n // 2, ROUTINGS[moe.routing],
                          moe.normalize, ACTIVATIONS[moe.activation_name], moe.router.data_ptr(), bias,
                          *(ctypes.cast(a, ctypes.POINTER(_Proj)) for a in arrays), *moe.swiglu)
        return cls(struct, keep)

    @property
    def address(self) -> int:
        return ctypes.addressof(self.struct)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x fp32 [n, H] contiguous -> the experts' weighted sum [n, H]."""
        out = torch.empty_like(x)
        load().tally_experts(self.address, x.data_ptr(), x.shape[0], out.data_ptr())
        return out
