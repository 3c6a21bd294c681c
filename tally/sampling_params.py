"""Per-request sampling parameters, with vLLM's names and defaults, validated once at the edge.

Every error names the parameter (`InvalidRequestError.param`) and says what value would be accepted,
so the HTTP layer can hand it straight to the client."""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from tally.errors import InvalidRequestError, echo

# Below this a temperature is treated as 0 (greedy), as vLLM does: dividing logits by 1e-6
# overflows float32 and the "sample" is the argmax anyway.
GREEDY_TEMPERATURE_EPS = 1e-5
MAX_LOGPROBS = 20  # the OpenAI API's cap on top_logprobs, and the engine's default --max-logprobs (vLLM's)
# What one request may ask for (docs/server.md lists them): each bounds memory or time per token.
MAX_N = 128  # the OpenAI API's cap on n
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 4096  # all stop strings together: stop matching reads each generated character once per string
MAX_STOP_TOKEN_IDS = 1024
MAX_LOGIT_BIAS = 300  # OpenAI's cap
MAX_ALLOWED_TOKEN_IDS = 1 << 20  # a bool row per request is built from them once
SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed takes


@dataclass
class StructuredOutputsParams:
    """vLLM's constrained decoding request: exactly one of a JSON schema, any JSON object, a regex, a choice of
    strings, or a grammar (Lark, or llama.cpp's GBNF). The engine compiles it (tally/engine/structured_output.py)."""

    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    # The constraint begins after this token (a reasoning model's end-of-thinking tag), as vLLM's grammar waits for
    # its reasoning parser: the thinking before it is free text.
    after_token_id: int | None = None
    # With after_token_id: the constraint binds from the first token, but this one (the start-of-thinking tag of a
    # model that may answer without thinking, Qwen3's) may come first, and then the constraint waits as above.
    opener_token_id: int | None = None

    def __post_init__(self) -> None:
        given = [name for name in ("json", "regex", "choice", "grammar", "json_object") if getattr(self, name)]
        _check(len(given) == 1, "structured_outputs",
               f"structured outputs take exactly one of json, regex, choice, grammar or json_object; got "
               f"{given or 'none'}")
        _check(self.choice is None or (isinstance(self.choice, list) and self.choice
                                       and all(isinstance(c, str) for c in self.choice)),
               "structured_outputs", "choice must be a non-empty list of strings")

    @property
    def kind(self) -> str:
        return next(n for n in ("json", "regex", "choice", "grammar", "json_object") if getattr(self, n))


class SamplingType(enum.IntEnum):
    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2


@dataclass
class SamplingParams:
    n: int = 1
    best_of: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: no top-k filtering
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16  # None: up to max_model_len, resolved by the engine
    min_tokens: int = 0
    logprobs: int | None = None  # number of top logprobs per token; 0 = only the chosen token's
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    structured_outputs: StructuredOutputsParams | None = None
    logit_bias: dict[int, float] | None = None  # OpenAI's: added to those tokens' logits, clamped to [-100, 100]
    allowed_token_ids: list[int] | None = None  # only these tokens may be sampled
    truncate_prompt_tokens: int | None = None  # keep only the prompt's last k tokens
    bad_words: list[str] | None = None  # vLLM's: words never generated (each as tokenized, with and without a space)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self._validate()

    def _validate(self) -> None:
        _check(1 <= self.n <= MAX_N, "n", f"n must be between 1 and {MAX_N}, got {self.n}")
        for name in ("presence_penalty", "frequency_penalty", "repetition_penalty", "temperature", "top_p", "min_p"):
            value = getattr(self, name)
            _check(isinstance(value, (int, float)) and math.isfinite(value), name,
                   f"{name} must be a finite number, got {echo(value)}")
        _check(
            self.best_of is None or self.best_of == self.n, "best_of",
            f"best_of={self.best_of} with n={self.n} is not supported; omit best_of or set it to n",
        )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(-2.0 <= value <= 2.0, name, f"{name} must be in [-2, 2], got {value}")
        _check(
            self.repetition_penalty > 0.0, "repetition_penalty",
            f"repetition_penalty must be > 0 (1 = off), got {self.repetition_penalty}",
        )
        _check(
            self.temperature >= 0.0, "temperature",
            f"temperature must be >= 0 (0 = greedy), got {self.temperature}",
        )
        _check(0.0 < self.top_p <= 1.0, "top_p", f"top_p must be in (0, 1] (1 = off), got {self.top_p}")
        _check(self.top_k >= -1, "top_k", f"top_k must be -1, 0 (both = off) or positive, got {self.top_k}")
        _check(0.0 <= self.min_p <= 1.0, "min_p", f"min_p must be in [0, 1] (0 = off), got {self.min_p}")
        if self.max_tokens is not None:
            # max_tokens=0 only makes sense to score a prompt (prompt_logprobs), as in vLLM.
            lowest = 0 if self.prompt_logprobs is not None else 1
            _check(
                self.max_tokens >= lowest, "max_tokens",
                "max_tokens must be at least 1 (0 only together with prompt_logprobs), "
                f"got {self.max_tokens}",
            )
        _check(self.min_tokens >= 0, "min_tokens", f"min_tokens must be >= 0, got {self.min_tokens}")
        _check(
            self.max_tokens is None or self.min_tokens <= self.max_tokens, "min_tokens",
            f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})",
        )
        for name in ("logprobs", "prompt_logprobs"):  # the upper bound is the engine's --max-logprobs
            value = getattr(self, name)
            _check(value is None or (isinstance(value, int) and value >= 0), name,
                   f"{name} must be a non-negative integer, got {echo(value)}")
        _check(
            all(isinstance(s, str) and s for s in self.stop), "stop",
            f"stop strings must be non-empty strings, got {echo(self.stop)}",
        )
        stop_chars = sum(map(len, self.stop))
        _check(
            len(self.stop) <= MAX_STOP_STRINGS and stop_chars <= MAX_STOP_CHARS, "stop",
            f"send at most {MAX_STOP_STRINGS} stop strings of at most {MAX_STOP_CHARS:,} characters together; "
            f"got {len(self.stop)} of {stop_chars:,}",
        )
        _check(
            self.seed is None or SEED_RANGE[0] <= self.seed <= SEED_RANGE[1], "seed",
            f"seed must be an integer in [-2**63, 2**64 - 1], got {echo(self.seed)}",
        )
        _check(
            len(self.stop_token_ids) <= MAX_STOP_TOKEN_IDS, "stop_token_ids",
            f"send at most {MAX_STOP_TOKEN_IDS} stop_token_ids, got {len(self.stop_token_ids)}",
        )
        _check(
            all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids), "stop_token_ids",
            f"stop_token_ids must be non-negative token ids, got {echo(self.stop_token_ids)}",
        )
        bias = self.logit_bias or {}
        _check(len(bias) <= MAX_LOGIT_BIAS, "logit_bias", f"send at most {MAX_LOGIT_BIAS} logit_bias entries")
        _check(all(isinstance(t, int) and t >= 0 and isinstance(b, (int, float)) and math.isfinite(b)
                   for t, b in bias.items()), "logit_bias",
               "logit_bias maps token ids (non-negative integers) to finite numbers")
        allowed = self.allowed_token_ids
        _check(allowed is None or (0 < len(allowed) <= MAX_ALLOWED_TOKEN_IDS
                                   and all(isinstance(t, int) and t >= 0 for t in allowed)), "allowed_token_ids",
               f"allowed_token_ids must be 1 to {MAX_ALLOWED_TOKEN_IDS} non-negative token ids")
        words = self.bad_words or []
        _check(len(words) <= MAX_STOP_STRINGS and all(isinstance(w, str) and w for w in words)
               and sum(map(len, words)) <= MAX_STOP_CHARS, "bad_words",
               f"bad_words takes at most {MAX_STOP_STRINGS} non-empty strings of {MAX_STOP_CHARS} characters in all")
        k = self.truncate_prompt_tokens
        _check(k is None or (isinstance(k, int) and k >= 1), "truncate_prompt_tokens",
               f"truncate_prompt_tokens must be a positive integer, got {echo(k)}")

    @property
    def sampling_type(self) -> SamplingType:
        # top_k=1 keeps only the argmax, so it *is* greedy; routing it there makes ties break the same way.
        if self.temperature < GREEDY_TEMPERATURE_EPS or self.top_k == 1:
            return SamplingType.GREEDY
        return SamplingType.RANDOM if self.seed is None else SamplingType.RANDOM_SEED

    @property
    def has_penalties(self) -> bool:
        return (
            self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0
        )


def _check(ok: bool, param: str, message: str) -> None:
    if not ok:
        raise InvalidRequestError(message, param=param)
