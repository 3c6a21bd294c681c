"""Token ids to text, a few tokens at a time, never emitting half a character.

vLLM's prefix/read offsets: decode a short window of ids that starts one step back
(`prefix_offset`), and emit what it adds beyond the text of the ids already read (`read_offset`).
While the window's text ends in U+FFFD the last token is only part of a UTF-8 character (emoji,
CJK, byte-fallback tokens), so nothing is emitted until the rest arrives. Each push decodes
O(window) ids, not the whole output."""
from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tally.models.tokenizer import Tokenizer

_REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """`.text` ends up equal to `tokenizer.decode(output_ids, skip_special_tokens=...)`.

    `prompt_token_ids` is taken for vLLM's call shape but does not seed the window: vLLM starts the
    window in the prompt, which keeps a SentencePiece first token's leading space ("▁Hi" -> " Hi")
    and so breaks that equality. For byte-level BPE tokenizers (Llama 3, Qwen, SmolLM) both agree."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_token_ids: list[int],
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None and getattr(tokenizer, "clean_up_tokenization_spaces", None) is False:
            # Without clean-up, tokenizer.decode is exactly the Rust decode plus ~10 us of Python
            # per call, and we decode twice per push.
            self._decode_ids = partial(backend.decode, skip_special_tokens=skip_special_tokens)
        else:
            self._decode_ids = partial(
                tokenizer.decode,
                skip_special_tokens=skip_special_tokens,
                spaces_between_special_tokens=spaces_between_special_tokens,
            )
        self.token_ids: list[int] = []
        self._prefix_offset = 0  # start of the window
        self._read_offset = 0  # ids before this are emitted as text
        self._parts: list[str] = []

    @property
    def text(self) -> str:
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""

    def push(self, token_ids: list[int]) -> str:
        """Add generated ids; return the new text they complete (may be empty)."""
        self.token_ids.extend(token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """At the end of a request: emit whatever was held back, even a broken character, so that
        `.text` matches the full decode."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        ids = self.token_ids
        prefix_text = self._decode(ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(ids[self._prefix_offset :])
        if len(new_text) <= len(prefix_text) or (new_text.endswith(_REPLACEMENT_CHAR) and not final):
            return ""
        delta = new_text[len(prefix_text) :]
        self._prefix_offset, self._read_offset = self._read_offset, len(ids)
        self._parts.append(delta)
        return delta

    def _decode(self, ids: list[int]) -> str:
        return self._decode_ids(ids) if ids else ""
