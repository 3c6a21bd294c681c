"""`speculative_config`: vLLM's JSON form of speculative decoding's settings, checked once at start-up."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tally.errors import ConfigError

METHODS = ("ngram", "draft_model")
# vLLM's other methods, refused by name rather than as unknown words.
NOT_YET = ("eagle", "eagle3", "medusa", "mlp_speculator", "deepseek_mtp", "suffix")
MAX_SPECULATIVE_TOKENS = 16  # every proposed token is a row of the verify step: a bound on its cost
DRAFT_CONTEXT_TOKENS = 256  # the default bound (docs/benchmarks.md#speculative-decoding)
# ngram's default num_speculative_tokens: the best fixed K quoting at one stream; the policy trims it where proposals
# are rarely kept or dear (docs/benchmarks.md#speculative-decoding)
NGRAM_SPECULATIVE_TOKENS = 6
# With a draft model, at most one running request in DRAFT_SHARE speculates: those the draft is least behind on. A
# request it is far behind on (new, or back from an off spell) costs a catch-up over its whole context, and on a CPU
# speculating many streams loses anyway; a price measured on a few requests also holds for a few, where extrapolating
# it to every one did not (docs/benchmarks.md#speculative-decoding).
DRAFT_SHARE = 4
EXAMPLE = '\'{"method": "ngram", "num_speculative_tokens": 4}\''


@dataclass(frozen=True)
class SpeculativeConfig:
    """--speculative-config '{"method": "ngram", "num_speculative_tokens": 6,
                               "prompt_lookup_min": 2, "prompt_lookup_max": 5}'
        --speculative-config '{"method": "draft_model", "model": "/path/to/small-model", "num_speculative_tokens": 4}'

    `num_speculative_tokens` is the most tokens proposed per request and step (ngram: 6 unless given; a draft model
    needs it); how many are proposed each step is the engine's choice (tally/engine/speculation/policy.py) unless
    "adaptive": false fixes it at that number. As in vLLM, a "model" without a "method" means "draft_model". Whether
    the draft model suits the target (same vocabulary, long enough context) is checked when it is loaded
    (tally/engine/speculation/draft_model.py).

    "draft_vocab_size": N (draft_model; the name of EAGLE-3's reduced draft vocabulary in vLLM and SGLang) has the
    draft's LM head score only token ids below N, the rest never proposed: a large vocabulary's head is a large part of
    a small draft's pass (Qwen2.5's 151,936 rows, ~30% of the 0.5B's), and byte-pair ids rise as merges get rarer, so
    the first ids hold most of what a text uses (FR-Spec's frequency-ranked draft vocabulary, by the merge order).
    Outputs do not change: every proposal is verified by the target, and a sampled request's draft distribution is
    zero past N, which rejection sampling accounts for. 0: the whole vocabulary."""
    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 5
    adaptive: bool = True
    model: str | None = None  # the draft model (method "draft_model"): a checkpoint dir, .gguf file or alias
    draft_context_tokens: int = DRAFT_CONTEXT_TOKENS  # the most of a request's last tokens a draft starts from; 0: all
    draft_vocab_size: int = 0  # the draft proposes only token ids below this; 0: any

    @classmethod
    def parse(cls, value: str | dict[str, Any] | None) -> SpeculativeConfig | None:
        """From the flag's JSON text or LLM(speculative_config=...)'s dict; None when speculation is off."""
        if value is None:
            return None
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ConfigError(f"speculative_config is not JSON ({e.msg}); e.g. {EXAMPLE}") from e
        if not isinstance(value, dict):
            raise ConfigError(f"speculative_config must be a JSON object, e.g. {EXAMPLE}")
        method = value.get("method", "draft_model" if "model" in value else None)
        if method in NOT_YET:
            raise ConfigError(f"speculative method {method!r} is not supported yet; use one of {METHODS}")
        if method not in METHODS:
            raise ConfigError(f"speculative_config needs a method, one of {METHODS}; got {method!r}")
        known = {"method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "adaptive"}
        if method == "draft_model":
            known |= {"model", "draft_context_tokens", "draft_vocab_size"}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ConfigError(f"speculative_config has unknown key(s) {unknown} for method {method!r}; known: "
                              f"{sorted(known)}")
        model = value.get("model")
        if method == "draft_model" and (not isinstance(model, str) or not model):
            raise ConfigError('method "draft_model" needs "model": the draft checkpoint (a directory, .gguf file or '
                              'alias) with the same tokenizer as the target, e.g. {"method": "draft_model", '
                              '"model": "/models/small", "num_speculative_tokens": 4}')
        k = value.get("num_speculative_tokens", NGRAM_SPECULATIVE_TOKENS if method == "ngram" else None)
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ConfigError(f"num_speculative_tokens must be an integer in [1, {MAX_SPECULATIVE_TOKENS}], "
                              f"got {k!r}")
        lo, hi = value.get("prompt_lookup_min", cls.prompt_lookup_min), value.get("prompt_lookup_max")
        hi = max(lo, cls.prompt_lookup_max) if hi is None else hi
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (lo, hi)) or not 1 <= lo <= hi:
            raise ConfigError(f"prompt_lookup_min and prompt_lookup_max must be integers with "
                              f"1 <= min <= max, got {lo!r} and {hi!r}")
        adaptive = value.get("adaptive", True)
        if not isinstance(adaptive, bool):
            raise ConfigError(f"adaptive must be true or false, got {adaptive!r}")
        window = value.get("draft_context_tokens", cls.draft_context_tokens)
        if not isinstance(window, int) or isinstance(window, bool) or window < 0:
            raise ConfigError(f"draft_context_tokens must be an integer >= 0 (0: the whole context), got {window!r}")
        vocab = value.get("draft_vocab_size", cls.draft_vocab_size)
        if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab < 0:
            raise ConfigError(f"draft_vocab_size must be an integer >= 0 (0: the whole vocabulary), got {vocab!r}")
        return cls(method, k, lo, hi, adaptive, model, window, vocab)
