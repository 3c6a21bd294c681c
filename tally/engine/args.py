"""Engine flags for `tally generate` and `tally serve`, made from EngineConfig's fields: one source for each
option's name, default, choices and help (tally/engine/config.py)."""
from __future__ import annotations

import argparse
import types
import typing
from dataclasses import fields

from tally.engine.config import EngineConfig


def add_engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    hints = typing.get_type_hints(EngineConfig)
    for f in fields(EngineConfig):
        meta = f.metadata
        names = [*meta["aliases"], "--" + f.name.replace("_", "-")]  # an alias reads first (--max-itl)
        kind = hints[f.name]
        if kind is bool:
            g.add_argument(*names, dest=f.name, action=argparse.BooleanOptionalAction, default=f.default,
                           help=meta["help"])
            continue
        g.add_argument(*names, dest=f.name, type=meta["parse"] or _value_type(kind), default=f.default,
                       choices=meta["choices"], nargs=meta["nargs"],
                       help=meta["help"] + ("" if f.default is None else " (default: %(default)s)"))


def config_from_args(ns: argparse.Namespace) -> EngineConfig:
    return EngineConfig(**{f.name: getattr(ns, f.name) for f in fields(EngineConfig)})


def _value_type(kind: object) -> type:
    """`int | None` -> int, `str | list[str] | None` -> str: the type a flag's text is converted to."""
    if isinstance(kind, types.UnionType):
        return next(arg for arg in typing.get_args(kind) if isinstance(arg, type) and arg is not type(None))
    return kind  # type: ignore[return-value]
