"""Pooling requests (embeddings): a prompt read once, chunked and batched like any other, whose final hidden states
(after the final norm) become one vector: the LAST token's, the MEAN over the prompt, or the first (CLS).

A pooling row never samples. The mean keeps a running float64 sum per request, not its rows; a chunk that starts at
position 0 starts it again (a request preempted by recompute reads its prompt again). MEAN and CLS need every
position computed, so their requests skip the prefix cache; LAST always computes the last position."""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F

from tally.core.request import Request, RequestStatus
from tally.core.scheduler import ScheduledRequest, SchedulerOutput
from tally.engine.inputs import StepInputs
from tally.errors import ConfigError, InvalidRequestError
from tally.models.sentence_transformers import CheckpointPooling
from tally.outputs import EmbeddingOutput, EmbeddingRequestOutput, RequestMetrics
from tally.pooling_params import PoolingParams

POOLING_TYPES = ("LAST", "MEAN", "CLS")
RUNNERS = ("auto", "generate", "pooling")  # vLLM's --runner
CONVERTS = ("auto", "none", "embed")  # vLLM's --convert
TASKS = ("auto", "generate", "embed", "score")  # vLLM's older --task; score: a cross-encoder (or cosines)
_POOLER_KEYS = ("pooling_type", "normalize", "is_matryoshka", "matryoshka_dimensions")


@dataclass(frozen=True)
class PoolerConfig:
    """How the model's embeddings are made: the checkpoint's say (tally/models/sentence_transformers.py), then
    --pooler-config over it; a decoder that says nothing pools its LAST token, normalised (vLLM's default)."""

    pooling_type: str = "LAST"
    normalize: bool = True
    is_matryoshka: bool = False  # requests may ask for fewer `dimensions`
    matryoshka_dimensions: tuple[int, ...] | None = None  # those they may ask for, where the checkpoint says


def parse_pooler_config(given: str | dict | None) -> dict:
    """--pooler-config's JSON (vLLM's keys pooling_type and normalize, and config.json's is_matryoshka and
    matryoshka_dimensions), checked key by key."""
    if given is None:
        return {}
    try:
        fields = json.loads(given) if isinstance(given, str) else dict(given)
    except ValueError as exc:
        raise ConfigError(f"pooler_config is not valid JSON: {exc}", param="pooler_config") from None
    unknown = sorted(set(fields) - set(_POOLER_KEYS))
    if unknown:
        raise ConfigError(f"pooler_config has unknown key(s) {unknown}; known: {list(_POOLER_KEYS)}",
                          param="pooler_config")
    kind = fields.get("pooling_type")
    if kind is not None:
        if str(kind).upper() not in POOLING_TYPES:
            raise ConfigError(f"pooler_config pooling_type {kind!r} is not one Tally pools; use one of "
                              f"{', '.join(POOLING_TYPES)}", param="pooler_config")
        fields["pooling_type"] = str(kind).upper()
    dims = fields.get("matryoshka_dimensions")
    if dims is not None:
        fields["matryoshka_dimensions"] = tuple(dims)
    return fields


def serving_runner(runner: str, convert: str, task: str, ckpt: CheckpointPooling) -> str:
    """generate or pooling: what the flags ask for, else what the checkpoint is (a sentence-transformers folder is
    an embedding model)."""
    asked = {r for r in (runner if runner != "auto" else None,
                         "pooling" if convert == "embed" or task in ("embed", "score") else None,
                         "generate" if task == "generate" else None) if r}
    if len(asked) > 1:
        raise ConfigError(f"runner {runner!r}, convert {convert!r} and task {task!r} disagree; --runner pooling "
                          "(or --convert embed) serves embeddings, --runner generate text", param="runner")
    if asked:
        return asked.pop()
    return "pooling" if ckpt.is_sentence_transformers else "generate"


def pooler_config(given: str | dict | None, ckpt: CheckpointPooling, serves_pooling: bool,
                  default_type: str = "LAST") -> PoolerConfig:
    """`default_type`: what a checkpoint that does not say pools (vLLM's: LAST for decoders, CLS for encoders)."""
    if serves_pooling and ckpt.problem is not None:
        raise ConfigError(f"{ckpt.problem}: its embeddings would differ from the checkpoint's own; serve a checkpoint "
                          "whose modules are a transformer, pooling and normalize", param="runner")
    said = {k: v for k, v in (("pooling_type", ckpt.pooling_type), ("normalize", ckpt.normalize)) if v is not None}
    base = PoolerConfig(default_type, is_matryoshka=ckpt.is_matryoshka,
                        matryoshka_dimensions=ckpt.matryoshka_dimensions)
    return replace(base, **{**said, **parse_pooler_config(given)})


def check_params(params: PoolingParams, pooler: PoolerConfig, hidden_size: int) -> None:
    dims = params.dimensions
    if dims is None:
        return
    if not pooler.is_matryoshka:
        raise InvalidRequestError("dimensions: this model was not trained to be truncated (Matryoshka); its "
                                  "embeddings would lose their meaning; omit dimensions", param="dimensions")
    allowed = pooler.matryoshka_dimensions
    if dims > hidden_size or (allowed is not None and dims not in allowed):
        what = f"one of {list(allowed)}" if allowed is not None else f"at most the model's {hidden_size}"
        raise InvalidRequestError(f"dimensions {dims} is not one this model gives; send {what}", param="dimensions")


@dataclass
class PoolingState:
    """One pooling request's running state, on its scheduler Request (`pooling`)."""

    params: PoolingParams
    pooling_type: str
    normalize: bool
    total: torch.Tensor | None = None  # MEAN: float64 sum of the rows computed so far
    first: torch.Tensor | None = None  # CLS: the first position's row

    @property
    def needs_every_position(self) -> bool:
        return self.pooling_type != "LAST"

    def take(self, hidden: torch.Tensor, start: int, n: int, total_tokens: int) -> torch.Tensor | None:
        """Fold in this step's rows hidden[0:n] (positions start .. start+n); the embedding once the last is in."""
        if start == 0:
            self.total, self.first = None, None
        if self.pooling_type == "MEAN":
            rows = hidden.double().sum(0)
            self.total = rows if self.total is None else self.total + rows
        elif self.pooling_type == "CLS" and start == 0:
            self.first = hidden[0].float()
        if start + n < total_tokens:
            return None
        vector = {"LAST": lambda: hidden[n - 1].float(), "CLS": lambda: self.first,
                  "MEAN": lambda: (self.total / total_tokens).float()}[self.pooling_type]()
        return self.finish(vector)

    def finish(self, vector: torch.Tensor) -> torch.Tensor:
        """Matryoshka: truncate, then normalise (vLLM's order)."""
        if self.params.dimensions is not None:
            vector = vector[:self.params.dimensions]
        normalize = self.normalize if self.params.normalize is None else self.params.normalize
        return F.normalize(vector, dim=0) if normalize else vector


def split_pooling_rows(out: SchedulerOutput,
                       inputs: StepInputs) -> tuple[StepInputs, list[tuple[int, ScheduledRequest]]]:
    """The step's inputs without the pooling requests' sample rows (they never sample), and (flat row of its first
    token, scheduled entry) of each pooling request in the step."""
    pooled = [(inputs.row_start[i], s) for i, s in enumerate(out.scheduled) if s.request.pooling is not None]
    if not pooled:
        return inputs, pooled
    keep, counts, index, first = [], [], [], 0
    flat = inputs.sample_token_index.tolist()
    for row, count in zip(inputs.sample_rows, inputs.sample_counts):
        if out.scheduled[row].request.pooling is None:
            keep.append(row)
            counts.append(count)
            index.extend(flat[first:first + count])
        first += count
    return replace(inputs, sample_rows=keep, sample_counts=counts,
                   sample_token_index=torch.tensor(index, dtype=torch.int64)), pooled


def pool_rows(pooled: list[tuple[int, ScheduledRequest]], hidden: torch.Tensor) -> dict[str, torch.Tensor]:
    """Fold each pooling request's rows of this step in; the embeddings of those whose prompt is now all read."""
    done = {}
    for row, s in pooled:
        req = s.request
        vector = req.pooling.take(hidden[row:row + s.num_new_tokens], req.num_computed_tokens, s.num_new_tokens,
                                  req.num_tokens)
        if vector is not None:
            done[req.request_id] = vector
    return done


@dataclass
class PoolingSequence:
    """What the engine's bookkeeping reads of a sequence (abort, forget): its request and whether it finished."""

    request: Request
    finish_reason: str | None = None

    @property
    def status(self) -> RequestStatus:
        return RequestStatus.FINISHED_ABORTED if self.finish_reason == "abort" else RequestStatus.FINISHED_STOPPED


@dataclass
class PoolingGroup:
    """The engine's record of one pooling request, beside the generation requests' RequestGroup."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    sequences: list[PoolingSequence]
    metrics: RequestMetrics
    embedding: list[float] | None = field(default=None, repr=False)

    @property
    def finished(self) -> bool:
        return self.sequences[0].finish_reason is not None

    def finish(self, vector: torch.Tensor) -> None:
        self.embedding = vector.tolist()
        self.sequences[0].finish_reason = "stop"

    def output(self) -> EmbeddingRequestOutput:
        return EmbeddingRequestOutput(
            request_id=self.request_id, prompt=self.prompt, prompt_token_ids=self.prompt_token_ids,
            outputs=None if self.embedding is None else EmbeddingOutput(self.embedding), finished=self.finished,
            metrics=self.metrics, num_cached_tokens=max(0, self.sequences[0].request.num_cached_tokens))
