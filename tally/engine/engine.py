"""The engine's step loop: schedule → run → sample → update → emit.

`add_request` validates and queues; `step` runs one forward pass over everything scheduled and
returns the outputs of every request that moved; `abort_request` frees a request at once."""
from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import replace

import torch

from tally.core.kv_manager import KVCacheManager
from tally.core.request import Request, RequestStatus
from tally.core.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from tally.core.static_scheduler import StaticBatchScheduler
from tally.engine.config import EngineConfig
from tally.engine.detokenizer import IncrementalDetokenizer
from tally.engine.group import RequestGroup
from tally.engine.kv_tiers.tiers import build_kv_tiers
from tally.engine.model_step import TPDriver
from tally.engine.multi_step import burst_steps
from tally.engine.pooling import PoolingGroup, PoolingSequence, PoolingState, check_params
from tally.engine.prompt_pass import PromptPass
from tally.engine.parallel.distributed import ParallelContext
from tally.engine.runner import ModelRunner, StepResult
from tally.engine.sequence import Sequence
from tally.engine.snapshot import EngineSnapshot
from tally.engine.speculation.draft_proposer import DraftProposer
from tally.engine.speculation.speculator import Speculator
from tally.engine.startup.load import load_model
from tally.engine.startup.loaded_model import LoadedModel
from tally.engine.step_log import StepLog
from tally.engine.step_stats import StepStats, mean_context, prompt_chunks
from tally.engine.stop import StopChecker
from tally.engine.structured_output import CompiledGrammar, GrammarCompiler
from tally.engine.lora_manager import LoRAManager, adapter_key
from tally.errors import EngineDeadError, InvalidRequestError
from tally.lora_request import LoRARequest
from tally.models.generation_config import max_tokens_or_default
from tally.outputs import EmbeddingRequestOutput, RequestMetrics, RequestOutput, logprob_entry
from tally.pooling_params import PoolingParams
from tally.sampling_params import SamplingParams

log = logging.getLogger("tally.engine")
# Steps are planned to take this share of --max-itl: steps of the same size vary by a third on a shared 2-core
# CPU (`python benchmarks/long_prompt_itl.py`), and the target is a bound on the gap, not its mean.
PLANNED_SHARE_OF_ITL = 0.75
# A prompt pass (tally/engine/prompt_pass.py) is sized for a layer of it to take this share of what the decode step
# leaves: short prompts that arrive while it runs still join the decode steps whole, and the slices fill the rest
# with its layers.
LAYER_SHARE_OF_SLICE = 0.5
# A pooling request's sampling parameters: never sampled, but read by the per-step checks (prompt logprobs).
_NOT_SAMPLED = SamplingParams()


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        m: LoadedModel = load_model(config)
        self.model = m.model  # for what runs beside the engine: the quality gate's self-test, benchmarks
        self.kv_layout = m.kv_layout
        self.kv_caches = m.kv_caches  # the pool's tensors, per layer (K, V)
        self.tokenizer = m.tokenizer
        self.sampling_defaults = m.sampling_defaults  # what requests that leave them unset get (server, LLM)
        self._stop_token_ids = m.stop_token_ids
        self._vocab_size = m.config.vocab_size
        self.stats = StepStats()
        self.step_log = StepLog(config.step_log) if config.step_log is not None else None
        self.model_names = config.served_model_names or (m.name,)
        self.model_name = self.model_names[0]  # the name the API reports
        self.max_model_len = m.max_model_len
        self.supported_tasks = m.supported_tasks  # what the API serves: ("generate",) or ("embed",), as vLLM
        self.pooler = m.pooler  # how a pooling request's vector is made (any model may take one here)
        self._hidden_size = m.config.hidden_size
        self._num_pooling = 0  # pooling requests held: only then does a step look for pooling rows
        self.kv_tiers = build_kv_tiers(config, m, self.stats.cost.prefill_seconds)  # swap space, disk prefix tier
        self.loras = None if not config.enable_lora else LoRAManager(
            m.model, config.max_loras, config.max_lora_rank, config.max_cpu_loras or config.max_loras)
        self.ledger = replace(m.ledger, kv_tiers=self.kv_tiers.ledger(),
                              lora=self.loras.ledger() if self.loras is not None else {})
        self.kv = KVCacheManager(m.num_blocks, config.block_size, config.enable_prefix_caching,
                                 sliding_window=m.config.uniform_sliding_window, prefix_tier=self.kv_tiers.disk)
        scheduler_cls = StaticBatchScheduler if config.scheduling == "static" else Scheduler
        self.scheduler = scheduler_cls(SchedulerConfig(
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_num_partial_prefills=config.max_num_partial_prefills,
            enable_chunked_prefill=config.enable_chunked_prefill,
            scheduling_policy=config.scheduling_policy,
            max_loras=config.max_loras,
        ), self.kv, self.kv_tiers.swap, self.kv_tiers.copy_block)
        self.parallel = m.parallel
        peers = TPDriver(m.parallel.control, m.parallel.env.world_size) if m.parallel is not None else None
        self.runner = ModelRunner(m.model, self.kv, m.kv_caches, peers,
                                  m.parallel.pipe if m.parallel is not None else None, self.loras)
        # The other ranks stop with this engine: when it is shut down, collected, or the interpreter exits.
        self._stop_ranks = weakref.finalize(self, _stop_ranks, peers, m.parallel) if peers is not None else None
        self.grammars = GrammarCompiler(m.tokenizer, m.config.vocab_size, m.stop_token_ids, config.grammar_limits)
        spec = config.speculative
        draft = None if m.draft is None else DraftProposer(m.draft, self.kv.block_size, spec.draft_context_tokens,
                                                           spec.draft_vocab_size)
        self.speculator = Speculator(spec, self.max_model_len, draft) if spec is not None else None
        # decode steps a step may run in one call (tally/engine/multi_step.py): where nobody verifies proposals, so
        # that speculation the policy keeps off costs nothing
        self._burst_limit = config.num_scheduler_steps if self.runner.runs_greedy_steps else 1
        # --max-itl beside decodes: a step's prompt chunks run as a pass of their own, a slice of layers a step
        # (tally/engine/prompt_pass.py); under tensor or pipeline parallelism every rank would have to follow the
        # slices, so there chunks stay small instead
        self._slices_prompts = config.max_itl_s is not None and peers is None
        self._pass: PromptPass | None = None
        self.groups: dict[str, RequestGroup] = {}
        self._seq_of: dict[str, tuple[Sequence, RequestGroup]] = {}  # scheduler request id → its sequence
        self._aborted: list[RequestGroup] = []
        log.info("ledger:\n%s", self.ledger.format())
        # --lora-modules by name, what the server lists
        self.served_loras = self.loras.serve(config.lora_modules, self.model_names) if self.loras is not None else {}

    def check_health(self) -> None:
        """EngineDeadError if a rank this process started (tensor / pipeline parallel) has exited (vLLM's
        check_health): the next step could never run, so the server should say so now rather than at the next
        request."""
        if self.parallel is None:
            return
        for rank, proc in enumerate(self.parallel.followers, start=1):
            if proc.poll() is not None:
                raise EngineDeadError(f"parallel rank {rank} exited with code {proc.returncode}; the engine "
                                      "cannot run without it: restart the server")

    def shutdown(self) -> None:
        """Stop the other ranks of a parallel engine; write the disk prefix tier's queued blocks."""
        self.kv_tiers.close()
        if self.step_log is not None:
            self.step_log.close()
        if self._stop_ranks is not None:
            self._stop_ranks()

    # -- requests ------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | list[int] | dict,
                    params: SamplingParams | PoolingParams | None = None, arrival_time: float | None = None,
                    cache_salt: str | None = None, grammar: CompiledGrammar | None = None, priority: int = 0,
                    lora_request: LoRARequest | None = None) -> None:
        """`grammar`: params.structured_outputs compiled (self.grammars.compile) where the caller could afford
        the wait; compiled here when not given. PoolingParams: an embedding request (tally/engine/pooling.py),
        which shares the steps of generation requests. `priority`: lower runs sooner, under --scheduling-policy
        priority. `lora_request`: the LoRA adapter it runs with (None: the base model)."""
        params = params or SamplingParams()
        if priority and not self.scheduler.by_priority:  # vLLM refuses it too: an order it cannot keep
            raise InvalidRequestError(f"priority {priority} needs a server started with --scheduling-policy priority "
                                      "(this one serves first come, first served); drop the field or send 0",
                                      param="priority")
        if request_id in self.groups:
            raise InvalidRequestError(f"request id {request_id!r} is already running", param="request_id")
        lora_key = None if lora_request is None else adapter_key(self.loras, lora_request, params)
        if isinstance(params, PoolingParams):
            return self._add_pooling(request_id, prompt, params, arrival_time, cache_salt, priority)
        text, ids = self._tokenize(prompt)
        if params.truncate_prompt_tokens is not None:
            ids = ids[-params.truncate_prompt_tokens:]  # vLLM keeps the prompt's end: the part nearest the answer
        self._validate(ids, params)
        max_tokens = max_tokens_or_default(params.max_tokens, self.sampling_defaults, self.max_model_len - len(ids))
        now = time.monotonic() if arrival_time is None else arrival_time
        eos = () if params.ignore_eos else self._stop_token_ids
        seqs, parent = [], None
        bad_words = self._bad_words(params.bad_words or ())
        if grammar is None and params.structured_outputs is not None:
            grammar = self.grammars.compile(params.structured_outputs)
        spec = params.structured_outputs
        after, opener = (spec.after_token_id, spec.opener_token_id) if grammar is not None else (None, None)
        held = after is not None and opener is None
        for i in range(params.n):
            rid = request_id if params.n == 1 else f"{request_id}#{i}"
            matcher = None if grammar is None else grammar.matcher()
            gen = None
            if params.seed is not None:
                gen = torch.Generator().manual_seed((params.seed + i) % 2**64)  # n>1 siblings: seed + i, wrapped
            req = Request(rid, ids, max_tokens, now, priority=priority, sampling_params=params, cache_salt=cache_salt,
                          lora_key=lora_key, eos_token_ids=eos, generator=gen,
                          skip_prefix_cache=params.prompt_logprobs is not None,
                          parent=parent, grammar=None if held else matcher, held_grammar=matcher if held else None,
                          grammar_after_token_id=after, grammar_opener_token_id=opener,
                          bad_words_token_ids=bad_words)
            parent = parent or req
            seq = Sequence(
                request=req, index=i,
                detokenizer=IncrementalDetokenizer(self.tokenizer, ids, params.skip_special_tokens,
                                                   params.spaces_between_special_tokens),
                stop=StopChecker(params.stop, params.include_stop_str_in_output) if params.stop else None,
                logprobs=[] if params.logprobs is not None else None,
            )
            seqs.append(seq)
        group = RequestGroup(request_id, text, ids, seqs, RequestMetrics(arrival_time=now))
        self.groups[request_id] = group
        for seq in seqs:
            self._seq_of[seq.request.request_id] = (seq, group)
        for seq in seqs:
            self.scheduler.add(seq.request)

    def _add_pooling(self, request_id: str, prompt: str | list[int] | dict, params: PoolingParams,
                     arrival_time: float | None, cache_salt: str | None, priority: int) -> None:
        if self.parallel is not None and self.parallel.pipe is not None:
            raise InvalidRequestError("embeddings do not run under pipeline parallelism (the hidden states stay on "
                                      "the last stage); serve the model with tensor_parallel_size instead")
        text, ids = self._tokenize(prompt)
        if params.truncate_prompt_tokens is not None:
            ids = ids[-params.truncate_prompt_tokens:]
        self._check_ids(ids)
        if len(ids) > self.max_model_len:
            raise InvalidRequestError(
                f"input has {len(ids):,} tokens but max_model_len is {self.max_model_len:,}; shorten it, send "
                f"truncate_prompt_tokens, or start the engine with --max-model-len ≥ {len(ids)}", param="input")
        check_params(params, self.pooler, self._hidden_size)
        state = PoolingState(params, self.pooler.pooling_type, self.pooler.normalize)
        now = time.monotonic() if arrival_time is None else arrival_time
        req = Request(request_id, ids, 0, now, priority=priority, sampling_params=_NOT_SAMPLED,
                      cache_salt=cache_salt, skip_prefix_cache=state.needs_every_position, pooling=state)
        self.groups[request_id] = group = PoolingGroup(request_id, text, ids, [PoolingSequence(req)],
                                                       RequestMetrics(arrival_time=now))
        self._seq_of[request_id] = (group.sequences[0], group)
        self._num_pooling += 1
        self.scheduler.add(req)

    def _bad_words(self, words: list[str] | tuple[()]) -> tuple[tuple[int, ...], ...]:
        """Each word as it would start the output and as it would follow a space (vLLM's two spellings)."""
        seqs = {tuple(self.tokenizer.encode(form, add_special_tokens=False))
                for word in words for form in (word, " " + word.lstrip())}
        return tuple(s for s in seqs if s)

    def _tokenize(self, prompt: str | list[int] | dict) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            prompt = prompt.get("prompt", "")
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt) if prompt else []
        return None, list(prompt)

    def _check_ids(self, ids: list[int]) -> None:
        if not ids:
            raise InvalidRequestError("prompt is empty; send at least one token", param="prompt")
        vocab = self._vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise InvalidRequestError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab})",
                                      param="prompt")

    def _validate(self, ids: list[int], params: SamplingParams) -> None:
        self._check_ids(ids)
        vocab = self._vocab_size
        for name in ("logprobs", "prompt_logprobs"):
            asked = getattr(params, name)
            if asked is not None and asked > self.config.max_logprobs:
                raise InvalidRequestError(f"{name} must be at most {self.config.max_logprobs}, got {asked}; the server "
                                          "can raise the bound with --max-logprobs", param=name)
        for name, given in (("logit_bias", params.logit_bias or ()), ("allowed_token_ids",
                                                                         params.allowed_token_ids or ())):
            bad = [t for t in given if t >= vocab]
            if bad:
                raise InvalidRequestError(f"{name} token ids {bad[:5]} are outside the vocabulary [0, {vocab})",
                                          param=name)
        n, limit = len(ids), self.max_model_len
        if n >= limit:
            raise InvalidRequestError(
                f"prompt has {n:,} tokens but max_model_len is {limit:,}; shorten the prompt or start "
                f"the engine with --max-model-len ≥ {n + 1}", param="prompt")
        if params.max_tokens is not None and n + params.max_tokens > limit:
            raise InvalidRequestError(
                f"prompt ({n:,} tokens) + max_tokens ({params.max_tokens:,}) exceeds max_model_len "
                f"({limit:,}); lower max_tokens to ≤ {limit - n:,}", param="max_tokens")
        if n + params.min_tokens > limit:  # (min_tokens ≤ max_tokens is SamplingParams' own check)
            raise InvalidRequestError(
                f"prompt ({n:,} tokens) + min_tokens ({params.min_tokens:,}) exceeds max_model_len ({limit:,}), "
                f"so the output would be cut before it may end; lower min_tokens to ≤ {limit - n:,}",
                param="min_tokens")

    def abort_request(self, request_id: str) -> None:
        group = self.groups.get(request_id)
        if group is None:
            return
        for seq in group.sequences:
            if seq.finish_reason is None:
                seq.finish_reason = "abort"
                self.scheduler.finish(seq.request, RequestStatus.FINISHED_ABORTED)
        self._aborted.append(group)

    def has_unfinished_requests(self) -> bool:
        return bool(self.groups)

    # -- the step ------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput | EmbeddingRequestOutput]:
        started_s = time.perf_counter()
        if self.speculator is not None:
            self.speculator.propose(self.scheduler.running)
        token_budget = self._token_budget()
        # while a pass runs, prompts join the decode step only whole: a long one waits to be the next pass
        out = self.scheduler.schedule(token_budget, chunks=self._pass is None)
        if self._slices_prompts and self._pass is None:
            self._hold_prompts(out)
        chunks = prompt_chunks(out)
        self.stats.num_steps += 1
        moved: dict[str, RequestGroup] = {g.request_id: g for g in self._aborted}
        self._aborted.clear()
        generated, steps = self._run(out, moved) if out.scheduled else (0, 1)
        seconds = time.perf_counter() - started_s
        sliced = self._advance_pass(moved, started_s) if self._pass is not None else None
        outputs = [g.output() for g in moved.values()]
        for g in moved.values():
            if g.finished:
                g.metrics.finished_time = time.monotonic()
                self._forget(g)
        if out.scheduled or sliced is not None:
            if self.step_log is not None:  # the prediction before this step refits it
                spec = self.speculator
                self.step_log.write(started_s, time.perf_counter() - started_s, out, chunks, token_budget,
                                    self.stats.cost.predict_seconds(sum(n for n, _ in chunks), mean_context(chunks)),
                                    len(self.scheduler.waiting), spec.step_proposals if spec is not None else 0,
                                    spec.step_proposing_s if spec is not None else 0.0, sliced)
        if out.scheduled:
            decode_only = self.stats.record(chunks, generated, seconds, steps)
            if decode_only and self.speculator is not None:
                self.speculator.observe_step(generated, seconds, len(out.scheduled), steps)
        return outputs

    def _run(self, out: SchedulerOutput, moved: dict[str, RequestGroup]) -> tuple[int, int]:
        """Run the scheduled requests and append what they made; returns (tokens appended, decode steps run)."""
        steps = burst_steps(out, self.scheduler, self.kv, self._burst_limit, self.max_model_len)
        if steps > 1:
            result = self.runner.execute_greedy(out, steps)
            keep = result.counts  # a request that finishes early stops taking tokens in _apply_samples
            steps = result.counts[0]  # fewer than asked where every request made a token that stops it
            for s in out.scheduled:
                s.num_new_tokens = steps  # every step's input token is computed now
        else:
            result = self.runner.execute(out, self.speculator.draft_probs if self.speculator is not None else None,
                                         pooling=self._num_pooling > 0)
            keep = self._verify(out, result)
        return self._take_result(out, result, keep, moved), steps

    def _take_result(self, out: SchedulerOutput, result: StepResult, keep: list[int],
                     moved: dict[str, RequestGroup]) -> int:
        """The step's forward ran: its tokens are computed; append what it made. Returns the tokens appended."""
        self.scheduler.finish_step(out)
        now = time.monotonic()
        for s in out.scheduled:
            group = self._seq_of[s.request.request_id][1]
            if group.metrics.first_scheduled_time is None:
                group.metrics.first_scheduled_time = s.request.first_scheduled_time or now
        for rid, vector in result.pooled.items():  # their prompt is read: done, blocks freed
            seq, group = self._seq_of[rid]
            group.finish(vector)
            group.metrics.first_token_time = group.metrics.last_token_time = now
            self.scheduler.finish(seq.request, RequestStatus.FINISHED_STOPPED)
            moved[rid] = group
        for rid, plp in result.prompt_logprobs.items():
            self._seq_of[rid][1].add_prompt_logprobs(plp, self._decode_one)
        return self._apply_samples(result, keep, now, moved)

    def _hold_prompts(self, out: SchedulerOutput) -> None:
        """A step that carries prompt chunks beside decodes under --max-itl: the chunks leave it for a pass of their
        own, which runs a slice of layers after each decode step until it ends (tally/engine/prompt_pass.py)."""
        prompts = [s for s in out.scheduled
                   if s.num_new_tokens > 1 and s.request.num_computed_tokens < s.request.num_prompt_tokens]
        if not prompts or len(prompts) == len(out.scheduled):
            return  # nobody decodes beside them: nobody waits for a slice
        chunks = prompt_chunks(SchedulerOutput(prompts))
        predicted = self.stats.cost.predict_seconds(sum(n for n, _ in chunks), mean_context(chunks))
        self._pass = PromptPass(self.runner, SchedulerOutput(prompts), self._num_pooling > 0,
                                predicted * self.stats.cost.jitter() / len(self.model.layers) if predicted else None)
        self.scheduler.held = {s.request.request_id for s in prompts}
        out.scheduled = [s for s in out.scheduled if s not in prompts]

    def _advance_pass(self, moved: dict[str, RequestGroup], started_s: float) -> dict | None:
        """The held pass's next slice: as many layers as fit what is left of the step's share of --max-itl (every
        layer left once nobody decodes); at its last, its requests take what it made. Returns the slice, for the
        step log."""
        p = self._pass
        if not p.intact():  # a request of it finished, was aborted or preempted: its blocks are gone
            self._end_pass()
            return None
        others = [r for r in self.scheduler.running if r.request_id not in self.scheduler.held]
        left_s = self.config.max_itl_s * PLANNED_SHARE_OF_ITL - (time.perf_counter() - started_s)
        layers = p.layers_within(left_s) if any(r.num_output_tokens > 0 for r in others) else p.num_layers
        start = p.next_layer
        p.advance(layers)
        sliced = {"tokens": p.tokens, "layers": [start, p.next_layer], "of": p.num_layers}
        if p.done:
            self._end_pass()
            result = p.result()
            chunks = prompt_chunks(p.out)
            generated = self._take_result(p.out, result, [1] * len(result.sampled), moved)
            self.stats.record_pass(chunks, generated, p.seconds)
        return sliced

    def _end_pass(self) -> None:
        self._pass = None
        self.scheduler.held = set()

    def _verify(self, out: SchedulerOutput, result: StepResult) -> list[int]:
        """Rows of the sampler's output each sampled request keeps: 1, or with speculation, 1 + proposals kept."""
        if self.speculator is None or sum(result.counts) == len(result.counts):  # nobody verified proposals
            return [1] * len(result.sampled)
        return self.speculator.verify(out, result.sampled, result.counts, result.sampler_output.token_ids.tolist())

    def _token_budget(self) -> int | None:
        """With --max-itl and streams decoding: the tokens a step may hold to come back within the target,
        never fewer than the decodes plus one block of prompt (a long prompt still moves). Where prompts run as
        passes of their own (_hold_prompts), a pass is as large as a layer of it in LAYER_SHARE_OF_SLICE of what the
        decode step leaves allows; while one runs, the step holds the decodes and the prompts that fit whole beside
        them and a layer of the pass."""
        if self.config.max_itl_s is None:
            return None
        running = self.scheduler.running
        decoding = sum(1 + len(r.spec_token_ids) for r in running if r.num_output_tokens > 0)
        if decoding == 0:
            return None  # nobody is waiting for a next token
        step_s = self.config.max_itl_s * PLANNED_SHARE_OF_ITL
        if self._pass is not None:  # prompts that fit whole beside the decodes and a layer of the pass
            room_s = step_s - self.stats.last_decode_step_s - self._pass.slowest_layer_s
            return decoding + self.stats.cost.prompt_tokens_within(room_s, 0) if room_s > 0 else decoding
        # Where the next chunk starts: the prompt being chunked, else a new one (from its start).
        context = max((r.num_computed_tokens for r in running if r.num_output_tokens == 0), default=0)
        if self._slices_prompts:  # the pass's own cost: a layer of it within a share of what the decode step leaves
            step_s = (step_s - self.stats.last_decode_step_s) * LAYER_SHARE_OF_SLICE * len(self.model.layers)
        prompt_tokens = self.stats.cost.prompt_tokens_within(step_s, context)
        return decoding + max(prompt_tokens, self.config.block_size)

    def _apply_samples(self, result: StepResult, keep: list[int], now: float,
                       moved: dict[str, RequestGroup]) -> int:
        """Append each request's kept tokens (stopping where one finishes it); returns the tokens appended."""
        so = result.sampler_output
        if so is None:
            return 0
        token_ids = so.token_ids.tolist()
        logprobs = so.logprobs.tolist()
        ranks = so.ranks.tolist() if so.ranks is not None else [None] * len(token_ids)
        top_ids, top_lps = (so.top_logprobs[0].tolist(), so.top_logprobs[1].tolist()) if so.top_logprobs is not None \
            else ([()] * len(token_ids), [()] * len(token_ids))
        appended, first_row = 0, 0
        for req, count, kept in zip(result.sampled, result.counts, keep):
            seq, group = self._seq_of[req.request_id]
            if group.metrics.first_token_time is None:
                group.metrics.first_token_time = now
            group.metrics.last_token_time = now
            moved[group.request_id] = group
            for i in range(first_row, first_row + kept):
                top = None
                if seq.logprobs is not None:
                    k = req.sampling_params.logprobs
                    top = logprob_entry(token_ids[i], logprobs[i], ranks[i], top_ids[i][:k], top_lps[i][:k],
                                        self._decode_one)
                appended += 1
                if (req.grammar is not None and token_ids[i] == req.grammar_opener_token_id
                        and not req.output_token_ids):  # the model opened its thinking: the constraint waits
                    req.grammar, req.held_grammar = None, req.grammar
                if seq.append(token_ids[i], logprobs[i], top, self.max_model_len) or (
                        req.grammar is not None and self._grammar_done(req, seq, token_ids[i])):
                    self.scheduler.finish(req, seq.status)
                    break
                if req.held_grammar is not None and token_ids[i] == req.grammar_after_token_id:
                    req.grammar, req.held_grammar = req.held_grammar, None
            first_row += count
        return appended

    @staticmethod
    def _grammar_done(req: Request, seq: Sequence, token_id: int) -> bool:
        """The matcher takes the token; a grammar that can take no more ends the sequence (finish reason stop)."""
        req.grammar.consume_token(token_id)
        return req.grammar.is_stopped() and seq.stop_by_grammar()

    def _decode_one(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def _forget(self, group: RequestGroup | PoolingGroup) -> None:
        if self.groups.pop(group.request_id, None) is not None and isinstance(group, PoolingGroup):
            self._num_pooling -= 1
        for seq in group.sequences:
            self._seq_of.pop(seq.request.request_id, None)

    # -- introspection -------------------------------------------------------------------------
    def num_running(self) -> int:
        return len(self.scheduler.running)

    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    def snapshot(self) -> EngineSnapshot:
        kv = self.kv
        return EngineSnapshot(
            num_running=self.num_running(), num_waiting=self.num_waiting(),
            num_blocks=kv.pool.num_blocks, num_free_blocks=kv.pool.num_free_blocks,
            num_cached_free_blocks=kv.pool.num_cached_free_blocks, num_used_blocks=kv.num_used_blocks(),
            num_unfilled_slots=kv.num_unfilled_slots(), block_size_tokens=kv.block_size,
            prefix_queried_tokens=kv.stats.queried_tokens, prefix_hit_tokens=kv.stats.hit_tokens,
            num_preemptions=self.scheduler.num_preemptions, num_steps=self.stats.num_steps,
            num_started=self.scheduler.num_started,
            prompt_tokens=self.stats.prompt_tokens, generated_tokens=self.stats.generated_tokens,
            decode_step_seconds=self.stats.decode_step_seconds, decode_step_tokens=self.stats.decode_step_tokens,
            speculation=self.speculator.stats.copy() if self.speculator is not None else None,
            speculation_policy=replace(self.speculator.policy.counters)
            if self.speculator is not None and self.speculator.config.adaptive else None,
            iteration_tokens=self.stats.iteration_tokens,
            swap=self.kv_tiers.swap_stats(), disk_cache=self.kv_tiers.disk_stats(),
        )

    def run_until_done(self, on_finished: Callable[[RequestOutput], None] | None = None) -> dict[str, RequestOutput]:
        final: dict[str, RequestOutput] = {}
        while self.has_unfinished_requests():
            for o in self.step():
                if o.finished:
                    final[o.request_id] = o
                    if on_finished is not None:
                        on_finished(o)
        return final


def _stop_ranks(peers: TPDriver, parallel: ParallelContext) -> None:
    try:
        peers.send(None)
    except Exception:  # noqa: BLE001 - a rank already gone must not keep the others from being reaped
        log.warning("could not tell every parallel rank to stop", exc_info=True)
    parallel.close()
