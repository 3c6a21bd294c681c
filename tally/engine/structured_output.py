"""Constrained decoding ("structured outputs"): a request's JSON schema, regex, choice or grammar becomes a
matcher that says, before each token, which tokens may come next; the sampler masks the others out.

The grammar engine is llguidance (the one behind vLLM's "guidance" backend and llama.cpp's LLGUIDANCE build):
grammars are compiled lazily against the tokenizer, so a schema costs nothing until it is used, and a token's
mask is computed in a few milliseconds. Masks are rows of a bitmask, one per constrained row of the batch, turned
into one boolean tensor the sampler applies in one masked_fill."""
from __future__ import annotations

import json
from typing import TYPE_CHECKING

import llguidance
import llguidance.hf
import llguidance.numpy
import numpy as np
import torch

from tally.errors import InvalidRequestError
from tally.sampling_params import StructuredOutputsParams

if TYPE_CHECKING:
    from tally.models.tokenizer import Tokenizer

ANY_JSON_OBJECT = {"type": "object"}
# JSON comes out with fixed separators (", " and ": ") and no other whitespace, as with vLLM's
# disable_any_whitespace: a weak model allowed free whitespace can pad an object with newlines until max_tokens
# cuts it (seen with every test model), and an object that never ends does not parse. A schema may still say
# otherwise in its own "x-guidance" key.
JSON_LAYOUT = {"whitespace_flexible": False}


class GrammarCompiler:
    """One per engine: the tokenizer in llguidance's form (built on first use, ~1 s) and a matcher per request."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, stop_token_ids: tuple[int, ...]) -> None:
        self._hf_tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._stop_token_ids = list(stop_token_ids)
        self._tokenizer: llguidance.LLTokenizer | None = None

    def matcher(self, spec: StructuredOutputsParams) -> llguidance.LLMatcher:
        """A fresh matcher for one sequence; a 400 naming what is wrong when the schema or grammar is."""
        if self._tokenizer is None:
            self._tokenizer = llguidance.hf.from_tokenizer(self._hf_tokenizer, n_vocab=self._vocab_size,
                                                           eos_token=self._stop_token_ids or None)
        try:
            grammar = grammar_text(spec)
        except (ValueError, TypeError) as e:
            raise InvalidRequestError(f"structured output {spec.kind} is not valid: {e}",
                                      param="structured_outputs") from None
        matcher = llguidance.LLMatcher(self._tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise InvalidRequestError(f"structured output {spec.kind} is not valid: "
                                      f"{matcher.get_error().strip()}", param="structured_outputs")
        return matcher


def grammar_text(spec: StructuredOutputsParams) -> str:
    if spec.json is not None or spec.json_object:
        schema = ANY_JSON_OBJECT if spec.json_object else json.loads(spec.json) if isinstance(spec.json, str) \
            else spec.json
        if not isinstance(schema, dict):
            raise ValueError("a JSON schema is an object")
        return llguidance.LLMatcher.grammar_from_json_schema(json.dumps({"x-guidance": JSON_LAYOUT, **schema}))
    if spec.regex is not None:
        return llguidance.LLMatcher.grammar_from_regex(spec.regex)
    if spec.choice is not None:
        return llguidance.grammar_from("choice", json.dumps(spec.choice))
    return llguidance.grammar_from("grammar", spec.grammar)  # Lark, or GBNF converted to Lark


def allowed_tokens(matchers: list[llguidance.LLMatcher], vocab_size: int) -> torch.Tensor:
    """bool [len(matchers), vocab_size]: the tokens each matcher allows next."""
    bitmask = llguidance.numpy.allocate_token_bitmask(len(matchers), vocab_size)
    for i, m in enumerate(matchers):
        llguidance.numpy.fill_next_token_bitmask(m, bitmask, i)
    # Bit j of word w is token 32·w + j: little-endian bytes, each unpacked low bit first.
    bits = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")
    return torch.from_numpy(bits[:, :vocab_size]).bool()
