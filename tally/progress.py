"""Progress through long loops (a checkpoint's tensors as they load and dequantize, `tally quantize`'s calibration
forwards and layers): a bar with an ETA on a terminal, a line per tenth of the way elsewhere (a log file), nothing
where a caller passes `untracked`. The total comes from the items' length, known before the first is read (a
checkpoint's from its headers)."""
from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

from rich.console import Console
from rich.progress import track

T = TypeVar("T")
Track = Callable[[Sequence[T], str], Iterable[T]]  # (items, what is done to them) → the items, progress shown


def untracked(items: Sequence[T], _description: str) -> Iterable[T]:
    return items


def on_stderr(items: Sequence[T], description: str) -> Iterable[T]:
    if sys.stderr.isatty():
        return track(items, description, console=Console(stderr=True))
    return _tenths(items, description)


def _tenths(items: Sequence[T], description: str) -> Iterator[T]:
    step = max(1, len(items) // 10)
    for done, item in enumerate(items, 1):
        yield item
        if done % step == 0 or done == len(items):
            print(f"{description}: {done}/{len(items)}", file=sys.stderr, flush=True)
