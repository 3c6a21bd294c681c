"""A checkpoint's tensors by name, each read when the model builder takes it.

A GGUF file's quantized tensors are served as their stored blocks, so reading them all as floats first would hold
every weight dequantized at once (fp32: ~7x a 4-bit file) for nothing. Here a tensor is read when it is popped, and
`take` hands over a reader without reading: the builder calls it only where a layer falls back to dense weights.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping
from functools import cache

import torch

Reader = Callable[[], torch.Tensor]


class TensorMap(MutableMapping[str, torch.Tensor]):
    def __init__(self, readers: dict[str, Reader], progress: Iterator[object] | None = None) -> None:
        """`readers`: name -> a function that reads the tensor. `progress`: advanced once per tensor taken (a
        loading bar over the names), run to its end by `finish`."""
        self._readers = readers
        self._progress = progress

    @classmethod
    def of(cls, tensors: dict[str, torch.Tensor]) -> TensorMap:
        """Tensors already read: each leaves `tensors` as the map hands it over, so the caller's dict is consumed."""
        return cls({name: (lambda name=name: tensors.pop(name)) for name in tensors})

    def take(self, name: str) -> Reader:
        """The tensor's reader, forgotten here; reading twice reads once."""
        reader = self._readers.pop(name)
        if self._progress is not None:
            next(self._progress, None)
        return cache(reader)

    def finish(self) -> None:
        """Ends the loading bar (its last line or its redraw comes when the names run out)."""
        if self._progress is not None:
            for _ in self._progress:
                pass

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._readers[name]()

    def pop(self, name: str, *default: torch.Tensor | None) -> torch.Tensor | None:  # type: ignore[override]
        if name not in self._readers and default:
            return default[0]
        return self.take(name)()

    def __setitem__(self, name: str, tensor: torch.Tensor) -> None:
        self._readers[name] = lambda: tensor

    def __delitem__(self, name: str) -> None:
        del self._readers[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._readers)

    def __len__(self) -> int:
        return len(self._readers)

    def __contains__(self, name: object) -> bool:
        return name in self._readers
