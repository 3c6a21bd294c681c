"""transformers reads a GGUF with gguf-py once per question (the tokenizer's config, the model's, its weights), and
each read walks the whole vocabulary item by item: one_gguf_read lets a single read answer them all."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest


@contextlib.contextmanager
def one_gguf_read(path: Path) -> Iterator[None]:
    """Within it, gguf.GGUFReader(path) is one reader made on entry. That read goes over a plain array view of the
    file's mapping: the same bytes and fields, without np.memmap's cost per slice (more than half of a read)."""
    read, memmap = gguf.GGUFReader, np.memmap
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(np, "memmap", lambda file, mode="r": memmap(file, mode=mode).view(np.ndarray))
        parsed = read(path)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFReader",
                      lambda file, *args, **kwargs: parsed if Path(file) == path else read(file, *args, **kwargs))
        yield
