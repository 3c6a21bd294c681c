"""A checkpoint's tensor names → Tally's, through the family's renames and fused tensors (family.py): one stored
tensor may hold the rows of several of Tally's, as Phi-3's qkv_proj holds q, k and v."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tally.errors import ModelLoadError
from tally.models.families import Family

_LAYER_PREFIX = "model.layers."


@dataclass(frozen=True)
class StoredPart:
    name: str  # Tally's name
    stored: str  # the checkpoint's name
    rows: slice | None = None  # the stored tensor's rows it holds; None: all of it
    take: Callable[[Any], Any] | None = None  # those rows -> Tally's tensor, where laid out otherwise (Relaid)
    shape: tuple[int, ...] | None = None  # Tally's tensor's, where `take` gives it


def tally_parts(stored: str, shape: tuple[int, ...], fam: Family,
                expected: dict[str, tuple[int, ...]]) -> list[StoredPart]:
    """The part(s) of Tally's tensors the stored tensor `stored` of `shape` holds."""
    if not stored.startswith(_LAYER_PREFIX):
        return [StoredPart(stored, stored)]
    layer, _, rest = stored.removeprefix(_LAYER_PREFIX).partition(".")
    prefix = f"{_LAYER_PREFIX}{layer}."
    relaid = fam.hf_relaid(rest, shape)
    if relaid:
        return [StoredPart(prefix + r.name, stored, r.rows, r.take, r.shape) for r in relaid]
    fused = fam.hf_fused.get(rest)
    if fused is None:
        return [StoredPart(prefix + fam.hf_rename(rest), stored)]
    return fused_parts(stored, shape, [prefix + part for part in fused], expected)


def fused_parts(stored: str, shape: tuple[int, ...], names: list[str],
                expected: dict[str, tuple[int, ...]]) -> list[StoredPart]:
    """The rows of `stored` each of Tally's `names` holds, one after another, as many as `expected` says."""
    parts, start = [], 0
    for name in names:
        rows = expected.get(name, (0,))[0]
        parts.append(StoredPart(name, stored, slice(start, start + rows)))
        start += rows
    if start != shape[0]:
        raise ModelLoadError(f"tensor {stored} has {shape[0]} rows but the config implies {start} "
                             f"({', '.join(p.name for p in parts)}); the config and the weights disagree")
    return parts


def part_shape(part: StoredPart, shape: tuple[int, ...]) -> tuple[int, ...]:
    if part.shape is not None:
        return part.shape
    if part.rows is None:
        return tuple(shape)
    return (part.rows.stop - part.rows.start, *shape[1:])
