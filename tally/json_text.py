"""JSON text from clients, measured before Python parses it: the parser recurses once per level of nesting, so a
text nested past MAX_JSON_DEPTH is refused by counting its brackets outside strings (vectorised), never parsed."""
from __future__ import annotations

import numpy as np

from tally.errors import InvalidRequestError

MAX_JSON_DEPTH = 64  # OpenAI bodies nest a few levels (tool schemas about ten)
_QUOTE, _BACKSLASH = ord('"'), ord("\\")


def json_depth(raw: bytes | str) -> int:
    """The deepest nesting of [ and { in a JSON text, strings left out, without parsing it: numpy over the positions
    of its quotes and brackets (a regex over the strings took seconds for a body as large as the body limit)."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    codes = np.frombuffer(raw, dtype=np.uint8)
    quotes = np.flatnonzero(codes == _QUOTE)
    after_slash = np.flatnonzero((quotes > 0) & (codes[quotes - 1] == _BACKSLASH))
    if len(after_slash):  # a quote after an odd run of backslashes is escaped: it neither opens nor closes a string
        slashes = np.flatnonzero(codes == _BACKSLASH)
        starts = np.flatnonzero(np.diff(slashes, prepend=-2) != 1)
        ends = slashes[np.append(starts[1:], len(slashes)) - 1]
        run = np.searchsorted(ends, quotes[after_slash] - 1)  # the run that ends right before each such quote
        quotes = np.delete(quotes, after_slash[(ends[run] - slashes[starts[run]]) % 2 == 0])
    opens = (codes == ord("[")) | (codes == ord("{"))
    brackets = np.flatnonzero(opens | (codes == ord("]")) | (codes == ord("}")))
    brackets = brackets[np.searchsorted(quotes, brackets) % 2 == 0]  # after an even number of quotes: outside
    return int(np.cumsum(np.where(opens[brackets], 1, -1)).max(initial=0))


def check_depth(raw: bytes | str, what: str, param: str | None = None) -> None:
    """InvalidRequestError naming `what` (and `param`) when `raw` nests deeper than MAX_JSON_DEPTH."""
    depth = json_depth(raw)
    if depth > MAX_JSON_DEPTH:
        raise InvalidRequestError(f"{what} nests {depth} levels deep; at most {MAX_JSON_DEPTH} are accepted",
                                  param=param)
