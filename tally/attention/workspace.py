"""Grow-only scratch buffers reused across layers and steps, so the decode path's large gathers
do not allocate (and page-fault in) fresh memory every layer of every step."""
from __future__ import annotations

import torch


class Workspace:
    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def get(
        self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
    ) -> torch.Tensor:
        """A contiguous [shape] tensor backed by the buffer `name`; its contents are garbage and it
        is overwritten by the next get() of the same name (callers use it within one forward)."""
        numel = 1
        for size in shape:
            numel *= size
        buf = self._buffers.get(name)
        if buf is None or buf.numel() < numel or buf.dtype != dtype or buf.device != device:
            buf = torch.empty(numel, dtype=dtype, device=device)
            self._buffers[name] = buf
        return buf[:numel].view(shape)
