"""Prompt lookup ("ngram" speculation): propose the tokens that followed the sequence's last n tokens where
those n tokens appeared before, in the prompt or the output. No weights, no memory: a search over token ids.

The longest n in [min, max] with an earlier match wins (a longer match predicts better); among matches of that
n, the most recent (generated text repeats what it said last more often than what it said first)."""
from __future__ import annotations

import numpy as np


def propose_ngram(token_ids: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the longest matching suffix; [] if none."""
    length = len(token_ids)
    if k <= 0 or length <= min_n:
        return []
    tokens = np.asarray(token_ids, dtype=np.int64)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n:]
        # Windows starting at 0 .. length - n - 1: every earlier place the suffix could sit (not itself).
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:length - 1], n)
        starts = np.flatnonzero((windows == suffix).all(axis=1))
        if starts.size:
            follow = int(starts[-1]) + n
            return token_ids[follow:follow + k]
    return []
