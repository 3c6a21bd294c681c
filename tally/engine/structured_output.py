"""Constrained decoding ("structured outputs"): a request's JSON schema, regex, choice or grammar is compiled into a
matcher that says, before each token, which tokens may come next; the sampler masks the others out.

The grammar engine is llguidance (the one behind vLLM's "guidance" backend and llama.cpp's LLGUIDANCE build). A
spec is compiled once, within tally/engine/grammar_limits.py's bounds (in the server on threads of its own, never the
engine's), and cached; each sequence it constrains gets a copy of its matcher, and a token's mask takes a few
milliseconds. Masks are rows of a bitmask, one per constrained row of the batch, turned into one boolean tensor the
sampler applies in one masked_fill."""
from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections import OrderedDict
from dataclasses import replace
from typing import TYPE_CHECKING

import llguidance
import llguidance.hf
import llguidance.numpy
import numpy as np
import torch

from tally.engine.grammar_limits import GrammarLimits
from tally.errors import InvalidRequestError, clip
from tally.json_text import check_depth
from tally.sampling_params import StructuredOutputsParams

if TYPE_CHECKING:
    from tally.models.tokenizer import Tokenizer

log = logging.getLogger("tally.engine")
ANY_JSON_OBJECT = {"type": "object"}
# JSON comes out with fixed separators (", " and ": ") and no other whitespace, as with vLLM's
# disable_any_whitespace: a weak model allowed free whitespace can pad an object with newlines until max_tokens
# cuts it (seen with every test model), and an object that never ends does not parse. A schema may still say
# otherwise in its own "x-guidance" key.
JSON_LAYOUT = {"whitespace_flexible": False}
# llguidance's own bounds on a grammar and on each token's mask, as it sets them, but terse errors: its verbose
# ones carry the parser's state and pieces of the grammar, which a client does not need back.
PARSER_LIMITS = llguidance.LLParserLimits(verbose_errors=False)


class CompiledGrammar:
    """A spec compiled once against the tokenizer: a matcher at its start, whose first mask is already computed.
    Every sequence the spec constrains (a request's n samples, later requests with the same spec) gets a copy,
    which shares the compiled grammar and the lexer states built so far: copying costs microseconds."""

    def __init__(self, start: llguidance.LLMatcher) -> None:
        self._start = start  # never advanced: only copied

    def matcher(self) -> llguidance.LLMatcher:
        return self._start.deep_copy()


class GrammarCompiler:
    """One per engine: the tokenizer in llguidance's form (built on first use, ~1 s) and a bounded cache of compiled
    grammars keyed by their spec. Thread-safe: the server compiles on its own threads (tally/engine/async_engine.py),
    offline `LLM` where it adds the request."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, stop_token_ids: tuple[int, ...],
                 limits: GrammarLimits = GrammarLimits()) -> None:
        self.limits = limits
        self._hf_tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._stop_token_ids = list(stop_token_ids)
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self.num_compiled = 0  # specs compiled, not found in the cache

    def compile(self, spec: StructuredOutputsParams) -> CompiledGrammar:
        """The spec's compiled grammar, from the cache or compiled now; a 400 naming what is wrong when the spec
        is too large (self.limits) or its schema, regex or grammar is not valid."""
        spec = _parsed(spec)
        try:
            key = _cache_key(spec)
        except (TypeError, ValueError) as e:  # LLM(): a schema dict that is not JSON
            raise InvalidRequestError(f"structured output {spec.kind} is not JSON: {_reason(str(e))}",
                                      param="structured_outputs") from None
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        self.limits.check(spec)
        try:
            grammar = grammar_text(spec)
        except (ValueError, TypeError) as e:
            raise InvalidRequestError(f"structured output {spec.kind} is not valid: {_reason(str(e))}",
                                      param="structured_outputs") from None
        start = llguidance.LLMatcher(self._llg_tokenizer(), grammar, log_level=0, limits=PARSER_LIMITS)
        if not start.is_error():  # the first mask builds the lexer's first states: here, not in an engine step
            llguidance.numpy.fill_next_token_bitmask(
                start, llguidance.numpy.allocate_token_bitmask(1, self._vocab_size), 0)
        if start.is_error():
            raise InvalidRequestError(f"structured output {spec.kind} is not valid: {_reason(start.get_error())}",
                                      param="structured_outputs")
        compiled = CompiledGrammar(start)
        with self._lock:
            self._cache[key] = compiled
            while len(self._cache) > self.limits.cache_size:
                self._cache.popitem(last=False)
            self.num_compiled += 1
        return compiled

    def _llg_tokenizer(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = llguidance.hf.from_tokenizer(self._hf_tokenizer, n_vocab=self._vocab_size,
                                                               eos_token=self._stop_token_ids or None)
            return self._tokenizer


def _parsed(spec: StructuredOutputsParams) -> StructuredOutputsParams:
    """A schema sent as JSON text, parsed (within the nesting bound every JSON body has) so it is counted as one."""
    if not isinstance(spec.json, str):
        return spec
    check_depth(spec.json, "structured output json schema", param="structured_outputs")
    try:
        return replace(spec, json=json.loads(spec.json))
    except ValueError as e:
        raise InvalidRequestError(f"structured output json is not valid JSON: {e}", param="structured_outputs") \
            from None


def _cache_key(spec: StructuredOutputsParams) -> str:
    text = json.dumps([spec.kind, getattr(spec, spec.kind)], sort_keys=True)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _reason(error: str) -> str:
    """llguidance's error as a client may read it: its first line, and never a panic's text or backtrace (an
    assertion inside the grammar engine: logged, not answered)."""
    lines = error.strip().splitlines() or ["no reason given"]
    if lines[0].startswith("panic"):
        log.warning("llguidance failed on a grammar: %s", lines[0])
        return "it is too large or complex for the grammar engine; make it smaller"
    return clip(lines[0], 300)


def grammar_text(spec: StructuredOutputsParams) -> str:
    if spec.json is not None or spec.json_object:
        schema = ANY_JSON_OBJECT if spec.json_object else spec.json
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
