"""JSON text from clients, measured before Python parses it: the parser recurses once per level of nesting, so a
text nested past MAX_JSON_DEPTH is refused by counting its brackets outside strings (vectorised), never parsed."""
from __future__ import annotations

import re

import numpy as np

from tally.errors import InvalidRequestError

MAX_JSON_DEPTH = 64  # OpenAI bodies nest a few levels (tool schemas about ten)
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_OPENERS, _CLOSERS = np.frombuffer(b"[{", dtype=np.uint8), np.frombuffer(b"]}", dtype=np.uint8)


def json_depth(raw: bytes | str) -> int:
    """The deepest nesting of [ and { in a JSON text, strings left out, without parsing it."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    unquoted = _JSON_STRING.sub(b"", raw)
    codes = np.frombuffer(unquoted, dtype=np.uint8)
    steps = np.isin(codes, _OPENERS).astype(np.int32) - np.isin(codes, _CLOSERS)
    return int(np.cumsum(steps).max(initial=0))


def check_depth(raw: bytes | str, what: str, param: str | None = None) -> None:
    """InvalidRequestError naming `what` (and `param`) when `raw` nests deeper than MAX_JSON_DEPTH."""
    depth = json_depth(raw)
    if depth > MAX_JSON_DEPTH:
        raise InvalidRequestError(f"{what} nests {depth} levels deep; at most {MAX_JSON_DEPTH} are accepted",
                                  param=param)
