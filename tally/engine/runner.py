"""ModelRunner: owns the model and its KV cache tensors; runs one scheduled step and samples."""
from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from tally.attention.kv_cache import KVCache
from tally.core.kv_manager import KVCacheManager
from tally.core.request import Request
from tally.core.scheduler import ScheduledRequest, SchedulerOutput
from tally.engine.inputs import StepInputs, build_step_inputs
from tally.engine.lora_manager import LoRAManager
from tally.engine.model_step import ModelStep, TPDriver, run_hidden_step, run_model_step
from tally.engine.parallel.pipeline import PipelinePeers, forward_step
from tally.engine.pooling import pool_rows, split_pooling_rows
from tally.engine.structured_output import allowed_tokens
from tally.errors import EngineDeadError
from tally.models.decoder import CausalLM
from tally.sample.batch import DraftRows, SamplerInput, SamplerOutput
from tally.sample.sampler import Sampler


@dataclass
class PromptLogprobs:
    """For positions [start, start + len) of a prompt: logprob of the *next* prompt token."""

    start: int
    token_logprobs: torch.Tensor  # [n]
    ranks: torch.Tensor  # [n]
    top_ids: torch.Tensor | None  # [n, k]
    top_logprobs: torch.Tensor | None  # [n, k]


@dataclass
class StepResult:
    sampled: list[Request]  # requests that sampled, in the order of sampler_output's rows
    counts: list[int]  # per sampled request: its rows in sampler_output (1 + proposals verified)
    sampler_output: SamplerOutput | None
    prompt_logprobs: dict[str, PromptLogprobs]
    pooled: dict[str, torch.Tensor] = field(default_factory=dict)  # embeddings of pooling requests that finished


@dataclass
class PreparedStep:
    """A scheduled step's inputs, before its forward runs."""

    out: SchedulerOutput
    inputs: StepInputs
    pooled: list[tuple[int, ScheduledRequest]]  # pooling requests' first rows (tally/engine/pooling.py)
    spans: list[tuple[Request, int, int, int]]  # prompt logprobs' rows (ModelRunner._prompt_logprob_spans)
    step: ModelStep


class ModelRunner:
    def __init__(self, model: CausalLM, kv: KVCacheManager, kv_caches: list[tuple[KVCache, KVCache]],
                 peers: TPDriver | None = None, pipeline: PipelinePeers | None = None,
                 loras: LoRAManager | None = None) -> None:
        self.model = model
        self.kv = kv
        self.kv_caches = kv_caches
        self.peers = peers  # tensor / pipeline parallel: the other ranks run every step beside this one
        self.pipeline = pipeline  # pipeline parallel: this rank is stage 0 and gets the logits from the last
        self.loras = loras  # per-row LoRA adapters, set up around each forward pass
        self.sampler = Sampler()  # keeps per-batch parameter tensors while the batch is unchanged

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput, draft_probs: dict[str, torch.Tensor] | None = None,
                pooling: bool = False) -> StepResult:
        """`draft_probs`: request id → [k, V] the draft model's distributions its proposals were drawn from (sampled
        requests speculating with a draft model): their rows are verified by rejection sampling. `pooling`: the
        engine holds pooling requests, which may be in this step (a step without them does no pooling work)."""
        prepared = self.prepare(out, pooling)
        with self.adapters(prepared):
            if prepared.pooled:
                logits, hidden = self._run(prepared.step, run_hidden_step)
            else:
                logits, hidden = self._run(prepared.step), None
        return self.finish(prepared, logits, hidden, draft_probs)

    def prepare(self, out: SchedulerOutput, pooling: bool = False) -> PreparedStep:
        """The step's inputs and the rows whose logits (and, with pooling requests, hidden states) it needs."""
        inputs = build_step_inputs(out, self.kv)
        pooled = []
        if pooling:
            inputs, pooled = split_pooling_rows(out, inputs)
        spans = self._prompt_logprob_spans(out, inputs.row_start)
        # Every row that needs logits goes through the head in one call (under tensor parallelism, one gather).
        rows = inputs.sample_token_index
        if spans:  # rare: a request asking for prompt logprobs
            rows = torch.cat([torch.arange(start, start + n) for _, _, start, n in spans] + [rows])
        step = ModelStep(inputs.input_ids, inputs.positions, inputs.meta, rows, returns_hidden=bool(pooled))
        return PreparedStep(out, inputs, pooled, spans, step)

    def adapters(self, prepared: PreparedStep) -> AbstractContextManager:
        """The step's per-row LoRA adapters, set up for as long as its forward runs (a pass split into several
        calls enters it around each)."""
        if self.loras is None:
            return nullcontext()
        return self.loras.step(prepared.out, prepared.inputs.row_start, len(prepared.inputs.input_ids))

    def finish(self, prepared: PreparedStep, logits: torch.Tensor, hidden: torch.Tensor | None,
               draft_probs: dict[str, torch.Tensor] | None = None) -> StepResult:
        """The forward's logits of the step's rows (and the final hidden states where it pools): prompt logprobs,
        embeddings, and the sampled tokens."""
        out, inputs, spans = prepared.out, prepared.inputs, prepared.spans
        embeddings = pool_rows(prepared.pooled, hidden) if prepared.pooled else {}
        n_prompt = len(prepared.step.logit_rows) - len(inputs.sample_token_index)
        prompt_lp = self._prompt_logprobs(spans, logits[:n_prompt])
        if not inputs.sample_rows:
            return StepResult([], [], None, prompt_lp, embeddings)
        logits = logits[n_prompt:]
        reqs = [out.scheduled[i].request for i in inputs.sample_rows]
        if len(reqs) == len(inputs.sample_token_index):  # no proposals to verify: one row per request
            rows, outputs = reqs, [r.output_token_ids for r in reqs]
        else:
            # Each sampled position is a row of its own, sampled from the target as if the proposals before it
            # had been generated (penalties and min_tokens see them): tally/engine/speculation/speculator.py verifies.
            rows = [r for r, count in zip(reqs, inputs.sample_counts) for _ in range(count)]
            outputs = [r.output_token_ids + r.spec_token_ids[:j] if j and reads_outputs(r) else r.output_token_ids
                       for r, count in zip(reqs, inputs.sample_counts) for j in range(count)]
        constrained = [i for i, r in enumerate(rows) if r.grammar is not None]
        allowed = allowed_tokens([rows[i].grammar for i in constrained], logits.shape[1]) if constrained else None
        for k, i in enumerate(constrained):
            if rows[i].grammar_opener_token_id is not None and not rows[i].output_token_ids:
                allowed[k, rows[i].grammar_opener_token_id] = True  # thinking may open first (Request's comment)
        sampler_input = SamplerInput(
            params=[r.sampling_params for r in rows],
            generators=[r.generator for r in rows],
            output_token_ids=outputs,
            prompt_token_ids=[r.prompt_token_ids for r in rows],
            eos_token_ids=[r.eos_token_ids for r in rows],
            allowed=(constrained, allowed) if constrained else None,
            bad_words_token_ids=[r.bad_words_token_ids for r in rows] if any(r.bad_words_token_ids for r in rows)
            else None,
            draft=_draft_rows(reqs, inputs.sample_counts, draft_probs) if draft_probs else None,
        )
        return StepResult(reqs, inputs.sample_counts, self.sampler(logits, sampler_input), prompt_lp, embeddings)

    @property
    def runs_greedy_steps(self) -> bool:
        """Whether execute_greedy can run: one process, and a native step from the token ids to the logits."""
        return self.peers is None and self.model.runs_greedy_steps(self.kv_caches)

    @torch.inference_mode()
    def execute_greedy(self, out: SchedulerOutput, steps: int) -> StepResult:
        """Up to `steps` greedy decode steps of a decode-only batch in one native call (tally/engine/multi_step.py
        decides when, and made room in the blocks), fewer where every request has made a token that stops it (EOS, a
        stop id): each request's tokens, in order, are its rows of the output, the same count for each."""
        inputs = build_step_inputs(out, self.kv)
        reqs = [out.scheduled[i].request for i in inputs.sample_rows]
        stops = [r.eos_token_ids + tuple(r.sampling_params.stop_token_ids) for r in reqs]
        with self.loras.step(out, inputs.row_start, len(inputs.input_ids)) if self.loras else nullcontext():
            tokens = self.model.greedy_steps(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta, steps,
                                             stops)
        sampled = SamplerOutput(tokens.reshape(-1), torch.zeros(tokens.numel()), None, None)
        return StepResult(reqs, [tokens.shape[1]] * len(reqs), sampled, {})

    def _run(self, step: ModelStep, run: Callable = run_model_step) -> Any:
        """`run`(model, kv caches, step) on this rank; a pooling step (run_hidden_step) never runs in a pipeline."""
        if self.peers is None:
            return run(self.model, self.kv_caches, step)
        self.peers.send(step)
        try:
            return forward_step(self.model, self.kv_caches, step, self.pipeline) if self.pipeline is not None \
                else run(self.model, self.kv_caches, step)
        except Exception as exc:
            # A step that failed on one rank leaves the ranks out of step with each other: none can go on.
            raise EngineDeadError(f"a parallel step failed ({type(exc).__name__}: {exc}); every rank must "
                                  "restart") from exc

    @staticmethod
    def _prompt_logprob_spans(out: SchedulerOutput, row_start: list[int]) -> list[tuple[Request, int, int, int]]:
        """(request, first prompt position, its flat row, how many) of each request asking for prompt logprobs
        whose rows this step computes: the positions that have a next prompt token."""
        spans = []
        for row, s in enumerate(out.scheduled):
            req = s.request
            c = req.num_computed_tokens
            if req.sampling_params.prompt_logprobs is None or c >= req.num_prompt_tokens - 1:
                continue
            end = min(c + s.num_new_tokens, req.num_prompt_tokens - 1)
            spans.append((req, c, row_start[row], end - c))
        return spans

    @staticmethod
    def _prompt_logprobs(spans: list[tuple[Request, int, int, int]],
                         logits: torch.Tensor) -> dict[str, PromptLogprobs]:
        result = {}
        offset = 0
        for req, c, _, n in spans:
            k = req.sampling_params.prompt_logprobs
            logprobs = torch.log_softmax(logits[offset:offset + n], dim=-1)
            offset += n
            targets = torch.tensor(req.token_ids[c + 1:c + n + 1])
            chosen = logprobs.gather(1, targets[:, None]).squeeze(1)
            ranks = (logprobs > chosen[:, None]).sum(1) + 1
            top = logprobs.topk(k, dim=-1) if k > 0 else None
            result[req.request_id] = PromptLogprobs(
                c, chosen, ranks, None if top is None else top.indices, None if top is None else top.values)
        return result


def _draft_rows(reqs: list[Request], counts: list[int], draft_probs: dict[str, torch.Tensor]) -> DraftRows | None:
    """The sampler rows that verify draft-model proposals drawn from a distribution: all of a request's rows but the
    last (the bonus token's)."""
    rows, tokens, probs, row = [], [], [], 0
    for req, count in zip(reqs, counts):
        q = draft_probs.get(req.request_id)
        if q is not None and count > 1:
            rows.extend(range(row, row + count - 1))
            tokens.extend(req.spec_token_ids[:count - 1])
            probs.append(q[:count - 1])
        row += count
    if not rows:
        return None
    return DraftRows(torch.tensor(rows), torch.tensor(tokens), torch.cat(probs))


def reads_outputs(req: Request) -> bool:
    """Whether sampling reads the tokens generated so far (penalties, min_tokens, bad_words): only then does a
    position after proposals need its own copy of them."""
    params = req.sampling_params
    return params.has_penalties or params.min_tokens > req.num_output_tokens or bool(req.bad_words_token_ids)
