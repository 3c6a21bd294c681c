"""Engine flags for `tally generate`, `tally serve` and `tally tune`, made from EngineConfig's fields: one source for
each option's name, default, choices and help (tally/engine/config.py; the ones other verbs take too, from
tally/flags.py)."""
from __future__ import annotations

import argparse
import types
import typing
from dataclasses import Field, fields

from tally.engine.config import EngineConfig
from tally.flags import Flag


def add_engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    hints = typing.get_type_hints(EngineConfig)
    for f in fields(EngineConfig):
        (f.metadata.get("flag") or _flag(f, hints[f.name])).add(g)


def config_from_args(ns: argparse.Namespace) -> EngineConfig:
    return EngineConfig(**{f.name: getattr(ns, f.name) for f in fields(EngineConfig)})


def _flag(f: Field, kind: object) -> Flag:
    meta = f.metadata
    if kind is bool:
        return Flag(f.name, meta["help"], f.default, aliases=meta["aliases"], action=argparse.BooleanOptionalAction)
    return Flag(f.name, meta["help"], f.default, type=meta["parse"] or _value_type(kind), choices=meta["choices"],
                aliases=meta["aliases"], nargs=meta["nargs"])


def _value_type(kind: object) -> type:
    """`int | None` -> int, `str | list[str] | None` -> str: the type a flag's text is converted to."""
    if isinstance(kind, types.UnionType):
        return next(arg for arg in typing.get_args(kind) if isinstance(arg, type) and arg is not type(None))
    return kind  # type: ignore[return-value]
