"""What `tally quantize --scheme` means, and the integer grid every calibrated method rounds onto.

A grid is per output row and per group of input columns: w ≈ (q - offset) * scale + zero, q in [qmin, qmax].
int4 (w4a16): asymmetric min/max per group, offset 8, q in 0..15 — the int4 kernel's own convention.
int8 (w8a16, w8a8): symmetric absmax per row (one group spanning every column), zero 0, q in -127..127.
Scales and zeros are rounded to fp16 (what the checkpoint stores) before any integer is chosen.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tally.errors import ConfigError
from tally.quant.rtn import quantize_int4_groupwise, quantize_int8_per_channel

STORE_DTYPE = torch.float16  # scales and zeros on disk
INT4_GROUPS = (128, 64, 32)  # the CPU int4 kernel's group sizes, largest first
SCHEME_HELP = "w4a16-g128 (or -g64, -g32), w8a16, w8a8"


@dataclass(frozen=True)
class QuantScheme:
    name: str  # w4a16 | w8a16 | w8a8
    group_size: int | None  # int4 only: the requested group (a layer it does not divide gets the next that does)

    @property
    def bits(self) -> int:
        return 4 if self.name == "w4a16" else 8

    def label(self) -> str:
        return f"{self.name}-g{self.group_size}" if self.group_size else self.name

    def group_for(self, in_features: int) -> int:
        """Columns per group for a layer with `in_features` inputs (int8: the whole row)."""
        if self.group_size is None:
            return in_features
        fits = [g for g in INT4_GROUPS if g <= self.group_size and in_features % g == 0]
        if not fits:
            raise ConfigError(f"no int4 group size (32, 64, 128) divides a layer's {in_features} input features; "
                              "use --scheme w8a16", param="scheme")
        return fits[0]


def parse_scheme(text: str) -> QuantScheme:
    name, _, group = text.lower().partition("-g")
    if name == "w4a16":
        size = int(group) if group.isdigit() else (128 if not group else -1)
        if size in INT4_GROUPS:
            return QuantScheme(name, size)
    elif name in ("w8a16", "w8a8") and not group:
        return QuantScheme(name, None)
    raise ConfigError(f"scheme {text!r} is not supported; use one of {SCHEME_HELP}", param="scheme")


@dataclass
class Grid:
    scale: torch.Tensor  # fp32 [N, G], values exactly representable in STORE_DTYPE
    zero: torch.Tensor  # fp32 [N, G]
    group_size: int
    offset: float
    qmin: float
    qmax: float

    def quantize(self, w: torch.Tensor, col0: int = 0) -> torch.Tensor:
        """Integers (as fp32) for columns col0.. of w [N, C] (C ≥ 1)."""
        groups = torch.arange(col0, col0 + w.shape[1], device=w.device) // self.group_size
        s, z = self.scale[:, groups], self.zero[:, groups]
        return torch.round((w - z) / s + self.offset).clamp_(self.qmin, self.qmax)

    def dequantize(self, q: torch.Tensor, col0: int = 0) -> torch.Tensor:
        groups = torch.arange(col0, col0 + q.shape[1], device=q.device) // self.group_size
        return (q - self.offset) * self.scale[:, groups] + self.zero[:, groups]

    def refit_group(self, w_group: torch.Tensor, group: int, scheme: QuantScheme) -> None:
        """Min/max of the (error-updated) columns of one group → that group's scale and zero (GPTQ, int4)."""
        part = fit_grid(w_group, scheme, group_size=w_group.shape[1])
        self.scale[:, group], self.zero[:, group] = part.scale[:, 0], part.zero[:, 0]


def fit_grid(w: torch.Tensor, scheme: QuantScheme, group_size: int | None = None) -> Grid:
    """The round-to-nearest grid of w [N, K] (the same scales rtn.py's quantizers pick, rounded to fp16)."""
    w = w.float()
    if scheme.bits == 8:
        _, scale = quantize_int8_per_channel(w, scale_dtype=STORE_DTYPE)
        s = scale.float()[:, None]
        return Grid(s, torch.zeros_like(s), w.shape[1], 0.0, -127.0, 127.0)
    group = group_size or scheme.group_for(w.shape[1])
    _, scale, zero = quantize_int4_groupwise(w, group, scale_dtype=STORE_DTYPE)
    return Grid(scale.float(), zero.float(), group, 8.0, 0.0, 15.0)


def rtn_dequantized(w: torch.Tensor, scheme: QuantScheme) -> torch.Tensor:
    """w after round-to-nearest on its own grid (what a layer built from it would multiply by)."""
    grid = fit_grid(w, scheme)
    return grid.dequantize(grid.quantize(w.float()))
