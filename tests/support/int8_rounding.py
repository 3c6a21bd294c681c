"""The activation rounding of Tally's integer kernels (tally/native/int_tiles.h: quantize_segments), in PyTorch."""
from __future__ import annotations

import torch


def int8_blocks(x: torch.Tensor) -> torch.Tensor:
    """x as the integer kernels see it: int8 per row and block of 32 (round half to even), dequantized."""
    blocks = x.view(*x.shape[:-1], -1, 32)
    d = blocks.abs().amax(-1, keepdim=True) / 127
    return (torch.round(blocks / d.clamp(min=1e-30)) * d).view(x.shape)
