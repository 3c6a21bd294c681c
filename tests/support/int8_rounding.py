"""The activation rounding of Tally's integer kernels (tally/native/int_tiles.h: quantize_segments), in PyTorch."""
from __future__ import annotations

import torch

from tally.native import ops


def int8_blocks(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """x as the integer kernels see it: int8 per row and block of `block` values (round half to even), dequantized."""
    blocks = x.view(*x.shape[:-1], -1, block)
    d = blocks.abs().amax(-1, keepdim=True) / 127
    return (torch.round(blocks / d.clamp(min=1e-30)) * d).view(x.shape)


def rounded_for(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """x as `layer`'s integer kernel rounds it (int_tiles.h: activation_block): per super-block of 256 where its
    scales are a K-quant's factors, else per 32."""
    d = getattr(layer, "d", None)
    form = 0 if d is None else ops.scale_form(d)
    return int8_blocks(x, form * layer.group_size if form >= 2 else 32)
