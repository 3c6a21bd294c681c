"""What a request gives back, shaped like vLLM's outputs so code written against vLLM reads ours."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None  # 1 = the model's most likely token
    decoded_token: str | None = None


# One dict per generated token: token id -> Logprob (the chosen token plus the top-k asked for).
SampleLogprobs = list[dict[int, Logprob]]
# One entry per prompt token; the first is None (nothing predicts it).
PromptLogprobs = list[dict[int, Logprob] | None]


def logprob_entry(token_id: int, logprob: float, rank: int | None, top_ids: Sequence[int] = (),
                  top_logprobs: Sequence[float] = (), decode: Callable[[int], str] | None = None) -> dict[int, Logprob]:
    """One position's entry, vLLM's shape: the chosen token first, then the top-k in rank order (1 = most likely),
    each once; used for sampled tokens and prompt tokens alike."""
    entry = {token_id: Logprob(logprob, rank, decode(token_id) if decode else None)}
    for k, (tid, lp) in enumerate(zip(top_ids, top_logprobs), 1):
        if tid not in entry:
            entry[tid] = Logprob(lp, k, decode(tid) if decode else None)
    return entry


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: SampleLogprobs | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort"; None while running
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    """Timestamps from time.monotonic(), in seconds; None until the event happens."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None

    @property
    def queue_s(self) -> float | None:
        return _since(self.arrival_time, self.first_scheduled_time)

    @property
    def ttft_s(self) -> float | None:
        return _since(self.arrival_time, self.first_token_time)

    @property
    def e2e_s(self) -> float | None:
        return _since(self.arrival_time, self.last_token_time)


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: PromptLogprobs | None
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0


def _since(start: float, end: float | None) -> float | None:
    return None if end is None else end - start


@dataclass
class EmbeddingOutput:
    embedding: list[float]


@dataclass
class EmbeddingRequestOutput:
    """vLLM's shape: `outputs.embedding` is the pooled vector of one prompt."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: EmbeddingOutput | None  # None while the prompt is still being read, or when aborted
    finished: bool
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0


@dataclass
class ScoringOutput:
    score: float


@dataclass
class ScoringRequestOutput:
    """vLLM's shape for LLM.score: one pair's `outputs.score`, with both prompts' token ids."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: ScoringOutput
    finished: bool = True
