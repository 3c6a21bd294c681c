"""Scoring: the pairs a score request's two sides make (one against many, or many against as many); with an embedding
model (a bi-encoder) a pair's score is the cosine of its two embeddings, with a cross-encoder the model reads both
texts as one input (`pair_prompt`) and its head gives the score."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import torch
import torch.nn.functional as F

from tally.errors import InvalidRequestError
from tally.models.tokenizer import MAX_CHARS_PER_TOKEN, Tokenizer

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


def pair_prompt(tokenizer: Tokenizer, first: str, second: str, max_tokens: int, param: str,
                keep: int | None = None) -> dict:
    """A cross-encoder's input: both texts in one sequence as its tokenizer pairs them, token types telling them
    apart. `keep` (truncate_prompt_tokens): cut the longer text first to fit, as transformers' truncation does."""
    for name, text in (("first", first), ("second", second)):
        if not text:
            raise InvalidRequestError(f"{param}: the pair's {name} text is empty; send text to score", param=param)
    if keep is None and len(first) + len(second) > max_tokens * MAX_CHARS_PER_TOKEN:
        raise InvalidRequestError(f"{param}: the pair has {len(first) + len(second):,} characters, more than "
                                  f"{max_tokens:,} tokens can hold; shorten it or send truncate_prompt_tokens",
                                  param=param)
    enc = tokenizer(first, second, truncation=keep is not None, max_length=keep)
    ids = enc["input_ids"]
    if len(ids) > max_tokens:
        raise InvalidRequestError(f"{param}: the pair has {len(ids):,} tokens but max_model_len is {max_tokens:,}; "
                                  "shorten it or send truncate_prompt_tokens", param=param)
    return {"prompt": None, "prompt_token_ids": ids, "token_type_ids": enc.get("token_type_ids") or [0] * len(ids)}
