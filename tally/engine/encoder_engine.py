"""The engine of an encoder checkpoint (embeddings, or a cross-encoder's scores): requests wait in arrival order, and
each step runs as many as --max-num-seqs and --max-num-batched-tokens allow as one packed batch, whole (attention is
bidirectional: no chunks, no KV cache). Its face is the Engine's, so the server and `LLM` drive either alike."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch

from tally.engine.config import DTYPES, EngineConfig
from tally.engine.engine import Engine
from tally.engine.pooling import PoolingState, check_params, pooler_config
from tally.engine.snapshot import EngineSnapshot
from tally.engine.startup.placing import place_threads
from tally.errors import ConfigError, InvalidRequestError
from tally.ledger.report import EngineLedger
from tally.lora_request import LoRARequest
from tally.models.encoders.config import EncoderConfig
from tally.models.encoders.loading import EncoderCheckpoint, load_encoder
from tally.models.registry import resolve_model
from tally.models.sentence_transformers import checkpoint_pooling, max_seq_length
from tally.models.tokenizer import load_tokenizer
from tally.outputs import EmbeddingOutput, EmbeddingRequestOutput, RequestMetrics
from tally.pooling_params import PoolingParams
from tally.sampling_params import SamplingParams

log = logging.getLogger("tally.engine")


@dataclass
class EncoderRequest:
    request_id: str
    prompt: str | None
    token_ids: list[int]
    token_type_ids: list[int]
    pooling: PoolingState
    priority: int
    metrics: RequestMetrics
    vector: list[float] | None = field(default=None, repr=False)
    aborted: bool = False

    @property
    def finished(self) -> bool:
        return self.aborted or self.vector is not None

    def output(self) -> EmbeddingRequestOutput:
        return EmbeddingRequestOutput(self.request_id, self.prompt, self.token_ids,
                                      None if self.vector is None else EmbeddingOutput(self.vector), self.finished,
                                      self.metrics)


class EncoderEngine:
    def __init__(self, config: EngineConfig, cfg: EncoderConfig) -> None:
        self.config = config
        place_threads(config, None)
        torch.manual_seed(config.seed)
        location = resolve_model(config.model)
        self.supported_tasks = ("score",) if cfg.is_cross_encoder else ("embed",)
        _check_flags(config, cfg)
        self.tokenizer = load_tokenizer(EncoderCheckpoint(location.path, location.name))
        self.model = load_encoder(location.path, cfg, _dtype(config.dtype))
        self.model_names = config.served_model_names or (location.name,)
        self.model_name = self.model_names[0]
        self.max_model_len = _context_length(config, cfg, max_seq_length(location.path))
        self.pooler = pooler_config(config.pooler_config, checkpoint_pooling(location.path), True, "CLS")
        self._hidden_size, self._vocab_size = cfg.hidden_size, cfg.vocab_size
        self.sampling_defaults: dict[str, float] = {}
        self.served_loras: dict = {}
        self.loras = self.parallel = self.grammars = None  # what generation engines have and encoders do not
        weight_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        self.ledger = EngineLedger(self.model_name, weight_bytes, kv_blocks=0, block_size=config.block_size,
                                   kv_bytes_per_token=0, kv_pool_bytes=0, reserve_bytes=0,
                                   max_model_len=self.max_model_len, max_num_seqs=config.max_num_seqs)
        self.groups: dict[str, EncoderRequest] = {}
        self._waiting: list[EncoderRequest] = []
        self._aborted: list[EncoderRequest] = []
        self._num_steps = self._num_started = self._prompt_tokens = 0
        log.info("encoder %s (%s): %d layers, hidden %d, max_model_len %d, serves %s", self.model_name,
                 cfg.architecture or cfg.model_type, cfg.num_layers, cfg.hidden_size, self.max_model_len,
                 self.supported_tasks[0])

    run_until_done = Engine.run_until_done  # the same loop over step()

    def check_health(self) -> None:
        """One process, nothing to lose: always healthy while it runs."""

    def shutdown(self) -> None:
        """Nothing to stop beside this process."""

    # -- requests ------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | list[int] | dict,
                    params: SamplingParams | PoolingParams | None = None, arrival_time: float | None = None,
                    cache_salt: str | None = None, grammar: object = None, priority: int = 0,
                    lora_request: LoRARequest | None = None) -> None:
        """A pooling request; `prompt` may be a dict with prompt_token_ids and token_type_ids (a cross-encoder's
        pair, tally/engine/scoring.py). `cache_salt` has nothing to salt: no cache is kept."""
        if not isinstance(params, PoolingParams):
            raise InvalidRequestError(f"this model ({self.model_name!r}) is an encoder: it does not support text "
                                      f"generation, only {self.supported_tasks[0]}", param="model")
        if lora_request is not None:
            raise InvalidRequestError("LoRA adapters are not served with encoder models; send the base model's name",
                                      param="model")
        if priority and self.config.scheduling_policy != "priority":
            raise InvalidRequestError(f"priority {priority} needs a server started with --scheduling-policy priority "
                                      "(this one serves first come, first served); drop the field or send 0",
                                      param="priority")
        if request_id in self.groups:
            raise InvalidRequestError(f"request id {request_id!r} is already running", param="request_id")
        text, ids, types = self._tokenize(prompt)
        keep = params.truncate_prompt_tokens
        if keep is not None and len(ids) > keep:  # the end of the text, behind the first (CLS) token
            ids, types = ids[:1] + ids[len(ids) - keep + 1:], types[:1] + types[len(ids) - keep + 1:]
        self._check_ids(ids, types)
        check_params(params, self.pooler, self._hidden_size)
        now = time.monotonic() if arrival_time is None else arrival_time
        req = EncoderRequest(request_id, text, ids, types, PoolingState(params, self.pooler.pooling_type,
                                                                       self.pooler.normalize),
                             priority, RequestMetrics(arrival_time=now))
        self.groups[request_id] = req
        self._waiting.append(req)

    def _tokenize(self, prompt: str | list[int] | dict) -> tuple[str | None, list[int], list[int]]:
        text, types = None, None
        if isinstance(prompt, dict):
            text, types = prompt.get("prompt"), prompt.get("token_type_ids")
            prompt = prompt["prompt_token_ids"] if "prompt_token_ids" in prompt else prompt.get("prompt", "")
        if isinstance(prompt, str):
            text, prompt = prompt, self.tokenizer.encode(prompt) if prompt else []
        ids = list(prompt)
        return text, ids, list(types) if types is not None else [0] * len(ids)

    def _check_ids(self, ids: list[int], types: list[int]) -> None:
        if not ids:
            raise InvalidRequestError("prompt is empty; send at least one token", param="prompt")
        bad = [t for t in ids if not (isinstance(t, int) and 0 <= t < self._vocab_size)]
        if bad:
            raise InvalidRequestError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {self._vocab_size})",
                                      param="prompt")
        if len(types) != len(ids) or any(not 0 <= t < self.model.config.type_vocab_size for t in types):
            raise InvalidRequestError(f"token_type_ids must be one per token, each below "
                                      f"{self.model.config.type_vocab_size}", param="token_type_ids")
        if len(ids) > self.max_model_len:
            raise InvalidRequestError(
                f"input has {len(ids):,} tokens but max_model_len is {self.max_model_len:,}; shorten it or send "
                "truncate_prompt_tokens", param="prompt")

    def abort_request(self, request_id: str) -> None:
        req = self.groups.pop(request_id, None)
        if req is None:
            return
        if req in self._waiting:
            self._waiting.remove(req)
        req.aborted = True
        self._aborted.append(req)

    def has_unfinished_requests(self) -> bool:
        return bool(self.groups) or bool(self._aborted)

    # -- the step ------------------------------------------------------------------------------
    def step(self) -> list[EmbeddingRequestOutput]:
        outputs = [r.output() for r in self._aborted]
        self._aborted.clear()
        batch = self._admit()
        if not batch:
            return outputs
        now = time.monotonic()
        for req in batch:
            req.metrics.first_scheduled_time = now
        vectors = self._run(batch)
        now = time.monotonic()
        for req, vector in zip(batch, vectors):
            req.vector = vector.tolist()
            req.metrics.first_token_time = req.metrics.last_token_time = req.metrics.finished_time = now
            del self.groups[req.request_id]
            outputs.append(req.output())
        self._num_steps += 1
        self._num_started += len(batch)
        self._prompt_tokens += sum(len(r.token_ids) for r in batch)
        return outputs

    def _admit(self) -> list[EncoderRequest]:
        """Waiting requests in order (by priority first under --scheduling-policy priority) while the batch, padded
        as attention sees it, stays within --max-num-batched-tokens (one request always fits: at most max_model_len)."""
        if self.config.scheduling_policy == "priority":
            self._waiting.sort(key=lambda r: (r.priority, r.metrics.arrival_time))
        budget = max(self.config.max_num_batched_tokens, self.max_model_len)
        batch, longest = [], 0
        for req in self._waiting:
            longest = max(longest, len(req.token_ids))
            if len(batch) == self.config.max_num_seqs or (len(batch) + 1) * longest > budget:
                break
            batch.append(req)
        del self._waiting[:len(batch)]
        return batch

    @torch.inference_mode()
    def _run(self, batch: list[EncoderRequest]) -> list[torch.Tensor]:
        lengths = torch.tensor([len(r.token_ids) for r in batch])
        ids = torch.tensor([t for r in batch for t in r.token_ids])
        types = torch.tensor([t for r in batch for t in r.token_type_ids])
        hidden = self.model(ids, types, lengths)
        starts = (torch.cumsum(lengths, 0) - lengths).tolist()
        if self.model.classifier is not None:
            return list(self.model.scores(hidden, torch.tensor(starts)))
        return [req.pooling.finish(_pool(hidden[start:start + len(req.token_ids)], req.pooling.pooling_type))
                for req, start in zip(batch, starts)]

    # -- introspection -------------------------------------------------------------------------
    def num_running(self) -> int:
        return 0  # a batch runs inside one step: between steps nothing is half done

    def num_waiting(self) -> int:
        return len(self._waiting)

    def snapshot(self) -> EngineSnapshot:
        return EngineSnapshot(num_waiting=self.num_waiting(), num_steps=self._num_steps,
                              num_started=self._num_started, prompt_tokens=self._prompt_tokens)


def _pool(rows: torch.Tensor, pooling_type: str) -> torch.Tensor:
    """One request's rows [n, H] → its vector, as sentence-transformers' Pooling module makes it."""
    if pooling_type == "CLS":
        return rows[0].float()
    if pooling_type == "LAST":
        return rows[-1].float()
    return rows.float().mean(0)


def _dtype(name: str) -> torch.dtype:
    """auto is float32: an encoder is small, and its vectors then match the checkpoint's own to the last digits."""
    if name == "auto":
        return torch.float32
    if name in DTYPES:
        return DTYPES[name]
    raise ConfigError(f"dtype {name!r} is not one Tally runs encoders in; use float32 or bfloat16", param="dtype")


def _context_length(config: EngineConfig, cfg: EncoderConfig, st_max: int | None) -> int:
    """--max-model-len, else sentence-transformers' max_seq_length, else the position table's length; never longer
    than the table."""
    limit = cfg.max_tokens
    if config.max_model_len is not None and config.max_model_len > limit:
        raise ConfigError(f"max_model_len {config.max_model_len:,} exceeds the encoder's {limit:,} positions; use "
                          f"--max-model-len ≤ {limit}", param="max_model_len")
    return config.max_model_len or min(limit, st_max or limit)


def _check_flags(config: EngineConfig, cfg: EncoderConfig) -> None:
    if config.runner == "generate" or config.task == "generate":
        raise ConfigError(f"{cfg.architecture or cfg.model_type} is an encoder: it cannot generate text; serve it "
                          "with --runner pooling (or leave --runner auto)", param="runner")
    if cfg.is_cross_encoder and "embed" in (config.task, config.convert):
        raise ConfigError(f"{cfg.architecture} is a cross-encoder: it scores pairs (--task score: /v1/score, "
                          "/v1/rerank) and makes no embeddings", param="task")
    if cfg.is_cross_encoder and cfg.num_labels != 1:
        raise ConfigError(f"{cfg.architecture} has {cfg.num_labels} labels; Tally scores with cross-encoders of one "
                          "label (a relevance logit)", param="model")
    for flag, on in (("enable_lora", config.enable_lora), ("speculative_config", config.speculative_config),
                     ("tensor_parallel_size", config.tensor_parallel_size > 1),
                     ("pipeline_parallel_size", config.pipeline_parallel_size > 1)):
        if on:
            raise ConfigError(f"{flag} does not apply to encoder models; drop it", param=flag)
