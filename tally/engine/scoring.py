"""Scoring with an embedding model (a bi-encoder, as vLLM scores with one): the cosine of two texts' embeddings,
and the pairs a score request's two sides make (one against many, or many against as many)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import torch
import torch.nn.functional as F

from tally.errors import InvalidRequestError

T = TypeVar("T")


def score_pairs(first: T | Sequence[T], second: T | Sequence[T], is_one: type | tuple[type, ...],
                names: tuple[str, str] = ("text_1", "text_2")) -> list[tuple[T, T]]:
    """(a, b) pairs: one first against every second, or the i-th first against the i-th second. `is_one`: the
    type(s) of a single item (a str; a token-id list is one item too, told apart by the caller)."""
    a = [first] if isinstance(first, is_one) else list(first)
    b = [second] if isinstance(second, is_one) else list(second)
    for name, side in zip(names, (a, b)):
        if not side:
            raise InvalidRequestError(f"{name} is empty; send at least one text", param=name)
    if len(a) == 1:
        a = a * len(b)
    if len(a) != len(b):
        raise InvalidRequestError(f"{names[0]} has {len(a)} items and {names[1]} {len(b)}; send one {names[0]}, or "
                                  f"as many as {names[1]} (scored pairwise)", param=names[1])
    return list(zip(a, b))


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    return F.cosine_similarity(torch.tensor([a]), torch.tensor([b])).item()
