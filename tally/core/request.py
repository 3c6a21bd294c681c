"""One sequence being generated: its tokens, how many of them the KV cache holds, and its status."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH,
                        RequestStatus.FINISHED_ABORTED)


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int  # resolved by the engine: never past max_model_len
    arrival_time: float
    priority: int = 0  # under the priority policy (vLLM's): lower is admitted sooner and preempted later
    sampling_params: Any = None  # tally.sampling_params.SamplingParams; opaque to the scheduler
    cache_salt: str | None = None  # part of every block hash: requests with different salts never share KV
    # the LoRA adapter's digest (tally/models/lora_adapter.py), None for the base model: it starts the block hash
    # chain, and a step holds at most max_loras different ones
    lora_key: str | None = None
    eos_token_ids: tuple[int, ...] = ()  # empty when ignore_eos
    generator: Any = None  # torch.Generator of a seeded request; opaque to the scheduler
    grammar: Any = None  # the structured-output matcher of a constrained request; opaque to the scheduler
    # A matcher held back until its request samples `grammar_after_token_id` (the end of its thinking); one that
    # binds at once but lets `grammar_opener_token_id` come first, which then holds it back.
    held_grammar: Any = None
    grammar_after_token_id: int | None = None
    grammar_opener_token_id: int | None = None
    bad_words_token_ids: tuple[tuple[int, ...], ...] = ()  # token sequences never to complete (bad_words)
    skip_prefix_cache: bool = False  # prompt logprobs need every prompt position computed (so do MEAN and CLS pooling)
    pooling: Any = None  # an embedding request's pooling state (tally/engine/pooling.py); opaque to the scheduler
    parent: "Request | None" = None  # a sibling of n>1 waits for the parent's prefill, then shares its blocks
    token_ids: list[int] = field(init=False)  # prompt then output: the "known" tokens
    output_token_ids: list[int] = field(default_factory=list)  # kept beside token_ids: read every step
    # Speculative proposals for the tokens after token_ids: computed with them in one step, kept only if verified.
    spec_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    status: RequestStatus = RequestStatus.WAITING
    block_hashes: list[int] = field(default_factory=list)  # chained hashes of full blocks, filled lazily
    block_keys: list[bytes] = field(default_factory=list)  # the same chain, stable across processes (kv_tiers.py)
    num_cached_tokens: int = -1  # prefix-cache hit at first admission (-1: not admitted yet)
    num_preemptions: int = 0
    first_scheduled_time: float | None = None

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return len(self.token_ids) + len(self.spec_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
        self.output_token_ids.append(token_id)

    @property
    def constrained(self) -> bool:
        """A grammar applies now or will: steps that sample several tokens unmasked (proposals, multi-step decode)
        must not take it."""
        return self.grammar is not None or self.held_grammar is not None

    @property
    def prefill_done(self) -> bool:
        return self.num_computed_tokens >= self.num_prompt_tokens - 1 and self.status == RequestStatus.RUNNING
