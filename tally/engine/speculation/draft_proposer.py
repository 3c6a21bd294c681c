"""The draft model's side of speculative decoding: per step it proposes up to k tokens for each request it is given
(k chosen per request, tally/engine/speculation/policy.py), in max k forward passes of its own (the first also
catches up on the request's tokens it has not run yet), each token drawn from its own distribution q (the argmax for
a greedy request), whose rows it keeps for rejection sampling."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from tally.core.request import Request
from tally.engine.inputs import build_span_inputs
from tally.engine.model_step import ModelStep, run_model_step
from tally.engine.runner import reads_outputs
from tally.engine.speculation.draft_kv import DraftBlocks, rebase_tokens
from tally.engine.speculation.draft_model import DraftModel
from tally.sample.batch import SamplerInput
from tally.sample.sampler import Sampler, greedy_tokens
from tally.sampling_params import SamplingType

SHORT_SPAN = 16  # a first pass over at most this many tokens is the proposal's own, not catch-up
TIMED_CATCH_UP = 64  # a first pass catching up on at least this many tokens measures catch_up_seconds_per_token


@dataclass
class DraftState:
    preemptions: int  # the request's num_preemptions when counted: preemption frees the blocks
    offset: int = 0  # the request's leading tokens the draft never read (whole blocks): its position 0 is there
    computed: int = 0  # the request's positions (from 0) up to which this draft wrote the KV of its known tokens
    proposed: int = 0  # how many it proposed last (their KV written for all but the last), not yet verified
    proposed_at: int = 0  # the request's num_tokens then: the first proposal's position
    blocks: list[int] = field(default_factory=list)  # its table in the draft's pool: position offset on


class DraftProposer:
    """Its KV lives in a pool of its own (tally/engine/speculation/draft_kv.py): per request a block table from the
    position it started at, held while the request runs and it drafts for it. Per request it counts the leading
    positions holding KV it wrote for that request (DraftState.computed). Proposing writes past them; a request whose
    table cannot grow takes blocks from those drafted for least recently, and goes without proposals this step where
    even that leaves too few. After verification only the kept proposals' KV counts: a rejected one's is rolled back
    by not counting it, and written over later.

    The draft runs only for requests that propose: while the policy keeps speculation off (for every request, or for
    one whose guesses do not pay) it costs nothing, and the next proposal first runs the draft over every token it
    missed, in one pass. So the draft's KV in a block is whole only where the draft wrote it for that request, and it
    never reads KV it did not write itself: a new request, or one preempted (its blocks freed, or swapped out and
    back), starts afresh even where the target's KV came from the prefix cache, the swap space or disk.

    Starting afresh, the draft reads only the request's last tokens: from `offset`, the block boundary at or before
    draft_context_tokens from its end (tally/engine/speculation/config.py), with that block's table entry as its first
    and positions counted from there. A request the draft fell further behind on than that (a spell without proposals),
    or whose window grew to the rebase point (draft_kv.py), starts afresh too: its catch-up and its table are bounded
    either way."""
    def __init__(self, draft: DraftModel, block_size: int, context_tokens: int = 0, vocab_rows: int = 0) -> None:
        self.draft = draft
        self.block_size = block_size
        self.pool = DraftBlocks(draft.num_blocks)
        self.evictions = 0  # tables given up for another request's, the pool being full
        self.context_tokens = context_tokens  # draft_context_tokens; 0: the whole context
        self.vocab_rows = vocab_rows  # draft_vocab_size: only token ids below it are proposed; 0: any
        self.catch_up_seconds_per_token: float | None = None  # measured on long catch-ups, averaged with the last
        self.last_catch_up_seconds = 0.0  # of the last propose: its first pass's share spent catching up
        self.sampler = Sampler()  # its own: the draft's batches are not the target's
        self._states: dict[Request, DraftState] = {}  # least recently drafted for first

    def forget(self, running: list[Request]) -> None:
        """Give back the tables of requests no longer running (finished, aborted, preempted or swapped out: the
        draft starts afresh on them anyway)."""
        live = {id(r) for r in running}
        for req in [r for r in self._states if id(r) not in live]:
            self.pool.give(self._states.pop(req).blocks)

    @torch.inference_mode()
    def propose(self, reqs: list[Request], ks: list[int]) -> tuple[dict[str, list[int]], dict[str, torch.Tensor]]:
        """For each request up to its k proposals (none where the draft's pool has no room for them): ({request id:
        proposals}, {request id: [k, V] q rows} of the sampled requests)."""
        self.last_catch_up_seconds = 0.0
        chosen: list[tuple[Request, int]] = []
        states: list[DraftState] = []
        keep: set[int] = set()  # id() of the chosen: their tables stay
        for req, k in zip(reqs, ks):
            if k > 0 and self._in_vocabulary(req):
                state = self._state(req)
                if self._grow(req, state, k, keep):
                    chosen.append((req, k))
                    states.append(state)
                    keep.add(id(req))
        if not chosen:
            return {}, {}
        tables = [state.blocks for state in states]
        offsets = [state.offset for state in states]
        spans = []
        for (req, _), table, state in zip(chosen, tables, states):
            start = min(state.computed, req.num_tokens - 1)  # at least the last token: its logits
            spans.append((table, start - state.offset, req.token_ids[start:]))
        started = time.perf_counter()
        logits = self._forward(spans, [r.num_prompt_tokens - o for (r, _), o in zip(chosen, offsets)])
        seconds, read = time.perf_counter() - started, sum(len(tokens) for _, _, tokens in spans)
        self._timed(read - len(spans), seconds)
        # The tokens of long spans beyond their last are catch-up, the rest the proposal's own first pass
        behind = sum(len(tokens) - 1 for _, _, tokens in spans if len(tokens) > SHORT_SPAN)
        self.last_catch_up_seconds = seconds * behind / read
        sampled = {i for i, (req, _) in enumerate(chosen) if req.sampling_params.sampling_type != SamplingType.GREEDY}
        proposals: list[list[int]] = [[] for _ in chosen]
        q_rows: list[list[torch.Tensor]] = [[] for _ in chosen]
        active = list(range(len(chosen)))
        for depth in range(max(k for _, k in chosen)):
            if depth:
                active = [i for i in active if chosen[i][1] > depth]
                last = [(tables[i], chosen[i][0].num_tokens + depth - 1 - offsets[i], proposals[i][-1:])
                        for i in active]
                logits = self._forward(last, [start for _, start, _ in last])
            q = self.sampler.distribution(logits, self._sampler_input([chosen[i][0] for i in active],
                                                                      [proposals[i] for i in active]))
            tokens = greedy_tokens(q)  # a greedy row's q is the point mass on its argmax
            rows = [row for row, i in enumerate(active) if i in sampled]
            if rows:
                tokens[rows] = torch.multinomial(q[rows], 1).squeeze(1)
            for row, (i, token) in enumerate(zip(active, tokens.tolist())):
                proposals[i].append(token)
                if i in sampled:
                    q_rows[i].append(q[row])
        for (req, _), state, tokens in zip(chosen, states, proposals):
            state.computed, state.proposed, state.proposed_at = req.num_tokens, len(tokens), req.num_tokens
        ids = {req.request_id: tokens for (req, _), tokens in zip(chosen, proposals)}
        probs = {req.request_id: torch.stack(rows) for (req, _), rows in zip(chosen, q_rows) if rows}
        return ids, probs

    def record_kept(self, req: Request, kept: int) -> None:
        """Verification kept the request's first `kept` proposals: the KV the draft wrote for them now counts (all
        but the last proposal's: that one was never run through the draft)."""
        state = self._states.get(req)
        if state is not None and state.proposed and state.proposed_at == req.num_tokens:
            state.computed = state.proposed_at + min(kept, state.proposed - 1)
            state.proposed = 0

    def start_seconds(self, lags: np.ndarray) -> np.ndarray:
        """What catching up on requests `lags` (lag()) behind before their next proposals is expected to cost: 0
        for the one or two tokens of a request the draft is current on, and before any catch-up was timed."""
        d = self.catch_up_seconds_per_token
        return np.where(lags > SHORT_SPAN, lags * d, 0.0) if d is not None else np.zeros(len(lags))

    def _timed(self, tokens: int, seconds: float) -> None:
        if tokens >= TIMED_CATCH_UP:
            d, per = self.catch_up_seconds_per_token, seconds / tokens
            self.catch_up_seconds_per_token = per if d is None else (d + per) / 2

    def lag(self, req: Request) -> int:
        """The request's tokens the draft has yet to run: what its next proposal first catches up on."""
        state = self._current(req)
        return req.num_tokens - (state.computed if state is not None else self._fresh_offset(req.num_tokens))

    def _current(self, req: Request) -> DraftState | None:
        """The request's draft state, unless it must start afresh (whatever the target's cache holds): new,
        preempted, further behind than a fresh start would read, or grown to the rebase point."""
        state = self._states.get(req)
        if state is None or state.preemptions != req.num_preemptions or state.computed < self._fresh_offset(
                req.num_tokens):
            return None
        if self.context_tokens and req.num_tokens - state.offset > rebase_tokens(self.context_tokens,
                                                                                 self.block_size):
            return None
        return state

    def _state(self, req: Request) -> DraftState:
        state = self._current(req)
        if state is None:
            old = self._states.pop(req, None)
            if old is not None:
                self.pool.give(old.blocks)
            fresh = self._fresh_offset(req.num_tokens)
            state = DraftState(req.num_preemptions, offset=fresh, computed=fresh)
        self._states[req] = self._states.pop(req, state)  # the most recently drafted for last
        state.proposed = 0  # proposals not verified (trimmed by the scheduler, or not scheduled) count for nothing
        return state

    def _grow(self, req: Request, state: DraftState, k: int, keep: set[int]) -> bool:
        """The request's table covers the positions its proposals write (all but the last one's), taking the
        blocks of requests drafted for least recently (not those in `keep`, nor itself) where the pool is short:
        whether it could."""
        bs = self.block_size
        short = -(-(req.num_tokens + k - 1 - state.offset) // bs) - len(state.blocks)
        if short <= 0:
            return True
        for other in [r for r in self._states if r is not req and id(r) not in keep]:
            if self.pool.num_free >= short:
                break
            self.pool.give(self._states.pop(other).blocks)
            self.evictions += 1
        if self.pool.num_free < short:
            return False
        state.blocks += self.pool.take(short)
        return True

    def _fresh_offset(self, num_tokens: int) -> int:
        """Where a fresh start on a request of num_tokens tokens begins: a block boundary, context_tokens or a
        little more before its end."""
        if not self.context_tokens:
            return 0
        return max(0, num_tokens - self.context_tokens) // self.block_size * self.block_size

    def _in_vocabulary(self, req: Request) -> bool:
        """Whether the request may sample a token the draft proposes: not when its allowed_token_ids all lie past a
        reduced draft vocabulary (its proposals would have no token to come from)."""
        allowed = req.sampling_params.allowed_token_ids
        return not self.vocab_rows or not allowed or min(allowed) < self.vocab_rows

    def _forward(self, spans: list[tuple[list[int], int, list[int]]], decodes_from: list[int]) -> torch.Tensor:
        """The draft over the spans; float32 logits at each span's last token. Positions from decodes_from[i] on (the
        request's outputs) run as decode rows, the prompt's as prefill rows, each through the kernel the target ran
        it with (build_span_inputs), so a model drafting for itself proposes the target's tokens exactly; a pass of
        decode rows alone takes the native one-call step where it applies."""
        ids, positions, meta, last_rows = build_span_inputs(spans, self.block_size, decodes_from)
        return run_model_step(self.draft.model, self.draft.kv_caches,
                              ModelStep(ids, positions, meta, last_rows, self.vocab_rows))

    @staticmethod
    def _sampler_input(reqs: list[Request], proposed: list[list[int]]) -> SamplerInput:
        """Each request's own sampling settings, the proposals before a position counted as output."""
        return SamplerInput(
            params=[r.sampling_params for r in reqs],
            generators=[None] * len(reqs),  # seeded requests are never speculated
            output_token_ids=[r.output_token_ids + p if p and reads_outputs(r) else r.output_token_ids
                              for r, p in zip(reqs, proposed)],
            prompt_token_ids=[r.prompt_token_ids for r in reqs],
            eos_token_ids=[r.eos_token_ids for r in reqs],
            bad_words_token_ids=[r.bad_words_token_ids for r in reqs] if any(r.bad_words_token_ids for r in reqs)
            else None,
        )
