"""Per-row LoRA deltas on top of any projection; the base keeps its own fast path. The step's adapters are stacked
side by side along the rank; where the native kernels are loaded each row takes its own adapter's delta there
(tally/native/lora_delta.h: fixed-order sums, so a row's delta never depends on the rows beside it, and the one-call
decode step adds the same deltas). Without them a step's leading rows (decodes) take y = base(x) + ((x @ A_all^T) *
mask) @ B_all^T, `mask` keeping each row's own adapter's columns, and a prompt's run of rows its own adapter's slice."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from tally.native.library import load
from tally.native.lora_delta import NativeLoRA

# (layer, site) → (A [r_site, in], B [out, r_site]), an adapter's weights (tally/models/lora_adapter.py)
AdapterWeights = Mapping[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]
# A run of one adapter's rows at least this long (a prompt chunk) is computed on its own, outside the mask: below it
# the mask's wasted columns cost less than another pair of calls.
RUN_ROWS = 8


class LoRASlots:
    """The adapters of the step running now, shared by every LoRAProjection of a model. `begin` before the forward
    pass, `end` after; while not active the projections add nothing."""

    def __init__(self) -> None:
        self.active = False
        self._keys: tuple[str, ...] = ()
        # (layer, site) → A_all [R, in], B_all^T [R, out], each slot's [first, end) rows of them
        self._stacks: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor, list[tuple[int, int]]]] = {}
        self._columns: dict[str, torch.Tensor] = {}  # site → the slot of each stacked rank column [R]
        self.native: NativeLoRA | None = None  # the stacks as the native kernels read them, where they are loaded
        self._masks: dict[str, torch.Tensor | None] = {}  # site → [head rows, R]; None: no mask needed
        self._head_rows = 0  # rows [0, head) go through the mask
        self._runs: list[tuple[int, int, int]] = []  # (first row, end row, slot) computed on their own

    def begin(self, keys: Sequence[str], adapters: Sequence[AdapterWeights], row_slots: torch.Tensor) -> None:
        """`adapters` (named by `keys`) in slot order; `row_slots` [T]: each flat row's slot, -1 for the base."""
        if tuple(keys) != self._keys:  # the stack is rebuilt only when the set of adapters changes
            self._stack(adapters)
            self._keys = tuple(keys)
        self.active = True
        if self.native is not None:
            self.native.rows(row_slots)
            return
        self._head_rows, self._runs = _split_rows(row_slots.tolist())
        head = row_slots[:self._head_rows]
        if not bool((head >= 0).any()):  # base rows only: nothing to add there
            self._head_rows = 0
        whole = len(keys) == 1 and bool((head == 0).all())  # every row the one adapter: no mask needed
        self._masks = {site: None if whole else (head[:, None] == cols[None, :]).to(self._dtype(site))
                       for site, cols in self._columns.items()}

    def end(self) -> None:
        self.active = False
        self._masks, self._runs = {}, []

    def add_delta(self, layer: int, site: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """y [T, out] (the base's output, which it adds to in place) plus each row's delta of x [T, in]. A decode
        step runs it on every projection of every layer: few calls, each in place."""
        stack = self._stacks.get((layer, site))
        if stack is None:
            return y
        if self.native is not None:
            return self.native.add(layer, site, x, y)
        a_all, b_t, spans = stack
        head = self._head_rows
        if head:
            x_head, y_head = (x, y) if head == x.shape[0] else (x[:head], y[:head])
            low = torch.mm(x_head, a_all.t())
            mask = self._masks[site]
            if mask is not None:
                low.mul_(mask)
            y_head.addmm_(low, b_t)
        for first, end, slot in self._runs:
            c0, c1 = spans[slot]
            if c1 > c0:
                y[first:end].addmm_(torch.mm(x[first:end], a_all[c0:c1].t()), b_t[c0:c1])
        return y

    def _stack(self, adapters: Sequence[AdapterWeights]) -> None:
        sites = {(layer, site) for weights in adapters for layer, site in weights}
        self._stacks, self._columns = {}, {}
        for layer, site in sorted(sites):
            parts = [(slot, w[(layer, site)]) for slot, w in enumerate(adapters) if (layer, site) in w]
            a_all = torch.cat([a for _, (a, _) in parts]).contiguous()
            b_all = torch.cat([b for _, (_, b) in parts], dim=1)
            ranks = {slot: a.shape[0] for slot, (a, _) in parts}
            starts = [sum(ranks.get(s, 0) for s in range(slot)) for slot in range(len(adapters))]
            spans = [(start, start + ranks.get(slot, 0)) for slot, start in enumerate(starts)]
            self._stacks[(layer, site)] = (a_all, b_all.t().contiguous(), spans)
            self._columns[site] = torch.cat([torch.full((a.shape[0],), slot) for slot, (a, _) in parts])
        self.native = NativeLoRA(self._stacks, len(adapters)) if load() is not None and self._stacks else None

    def _dtype(self, site: str) -> torch.dtype:
        return next(a.dtype for (_, s), (a, *_) in self._stacks.items() if s == site)


def _split_rows(slots: list[int]) -> tuple[int, list[tuple[int, int, int]]]:
    """(rows [0, head) for the mask, the adapter runs after them each computed alone): the head ends where the first
    run of RUN_ROWS or more rows of one slot (base or adapter) starts."""
    runs, first = [], 0
    for i in range(1, len(slots) + 1):
        if i == len(slots) or slots[i] != slots[first]:
            runs.append((first, i, slots[first]))
            first = i
    head = next((f for f, e, _ in runs if e - f >= RUN_ROWS), len(slots))
    return head, [(f, e, s) for f, e, s in runs if f >= head and s >= 0]


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
