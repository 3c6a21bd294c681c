"""Prompt lookup ("ngram" speculation): propose the tokens that followed the sequence's last n tokens where
those n tokens appeared before, in the prompt or the output. No weights, no memory: a search over token ids.

The longest n in [min, max] with an earlier match wins (a longer match predicts better); among matches of that
n, the most recent (generated text repeats what it said last more often than what it said first).

One pass over the sequence finds the earlier places of its last token; each further token of the suffix keeps
the places that match it too, so the search costs one comparison of the whole sequence and a few of a handful of
places, where comparing every window of every n with the suffix cost a visible share of a verify step."""
from __future__ import annotations

import numpy as np


def propose_ngram(token_ids: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the longest matching suffix; [] if none."""
    length = len(token_ids)
    if k <= 0 or length <= min_n:
        return []
    tokens = np.asarray(token_ids, dtype=np.int64)
    ends = np.flatnonzero(tokens[:length - 1] == tokens[-1])  # where an earlier match of the last n would end
    found = None
    for n in range(1, max_n + 1):  # ends: the earlier places the last n tokens match
        if not ends.size:
            break
        if n >= min_n:
            found = ends
        if n < max_n:
            ends = ends[ends >= n]
            ends = ends[tokens[ends - n] == tokens[length - 1 - n]]
    if found is None:
        return []
    follow = int(found[-1]) + 1
    return token_ids[follow:follow + k]
