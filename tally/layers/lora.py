"""Per-row LoRA deltas on top of any projection: y = base(x) + ((x @ A_all) * mask) @ B_all, where A_all and B_all
stack the step's active adapters side by side along the rank and `mask` keeps, for each row, the columns of its own
adapter (none for a base row: its delta is exactly zero). Two matmuls a projection whatever the mix of adapters, at a
cost of (adapters x rank) columns, small beside the base's; the base keeps its own fast path."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

# (layer, site) → (A [r_site, in], B [out, r_site]), an adapter's weights (tally/models/lora_adapter.py)
AdapterWeights = Mapping[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]


class LoRASlots:
    """The adapters of the step running now, shared by every LoRAProjection of a model. `begin` before the forward
    pass, `end` after; while not active the projections add nothing."""

    def __init__(self) -> None:
        self.active = False
        self._keys: tuple[str, ...] = ()
        self._stacks: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}  # A_all^T [in, R], B_all^T [R, out]
        self._columns: dict[str, torch.Tensor] = {}  # site → the slot of each stacked rank column [R]
        self._masks: dict[str, torch.Tensor | None] = {}

    def begin(self, keys: Sequence[str], adapters: Sequence[AdapterWeights], row_slots: torch.Tensor) -> None:
        """`adapters` (named by `keys`) in slot order; `row_slots` [T]: each flat row's slot, -1 for the base."""
        if tuple(keys) != self._keys:  # the stack is rebuilt only when the set of adapters changes
            self._stack(adapters)
            self._keys = tuple(keys)
        whole = len(keys) == 1 and bool((row_slots == 0).all())  # every row the one adapter: no mask needed
        self._masks = {site: None if whole else (row_slots[:, None] == cols[None, :]).to(self._dtype(site))
                       for site, cols in self._columns.items()}
        self.active = True

    def end(self) -> None:
        self.active = False
        self._masks = {}

    def add_delta(self, layer: int, site: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        stack = self._stacks.get((layer, site))
        if stack is None:
            return y
        a_t, b_t = stack
        low = x.reshape(-1, x.shape[-1]).to(a_t.dtype) @ a_t
        mask = self._masks[site]
        if mask is not None:
            low = low * mask
        return y + (low @ b_t).to(y.dtype).view(y.shape)

    def _stack(self, adapters: Sequence[AdapterWeights]) -> None:
        sites = {(layer, site) for weights in adapters for layer, site in weights}
        self._stacks, self._columns = {}, {}
        for layer, site in sorted(sites):
            parts = [(slot, w[(layer, site)]) for slot, w in enumerate(adapters) if (layer, site) in w]
            a_all = torch.cat([a for _, (a, _) in parts])
            b_all = torch.cat([b for _, (_, b) in parts], dim=1)
            self._stacks[(layer, site)] = (a_all.t().contiguous(), b_all.t().contiguous())
            self._columns[site] = torch.cat([torch.full((a.shape[0],), slot) for slot, (a, _) in parts])

    def _dtype(self, site: str) -> torch.dtype:
        return next(a_t.dtype for (_, s), (a_t, _) in self._stacks.items() if s == site)


class LoRAProjection(nn.Module):
    """A projection whose rows get their adapter's delta (LoRASlots) after the base computes them."""

    def __init__(self, base: nn.Module, slots: LoRASlots, layer: int, site: str) -> None:
        super().__init__()
        self.base = base
        self.slots = slots
        self.layer = layer
        self.site = site

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        return self.slots.add_delta(self.layer, self.site, x, y) if self.slots.active else y
