"""The draft model's side of speculative decoding: per step it proposes up to K tokens for each request it is given,
in K forward passes of its own (the first also catches up on the request's tokens it has not run yet), each token
drawn from its own distribution q (the argmax for a greedy request), whose rows it keeps for rejection sampling.

Its KV lives in the target's blocks: the same block table, position for position, in tensors of its own shape
(tally/engine/model_setup.py sizes the pool for both). Per request it counts the leading positions that hold its KV
of known tokens (DraftState.computed). Proposing writes past them, in the blocks the scheduler would allocate for the
verify step anyway (taken here, one step early, only while a block per running request stays free: nobody is
preempted for a bet). After verification only the accepted proposals' KV counts: a rejected one's is rolled back by
not counting it, and written over later. Before the target's blocks are registered in the prefix cache,
`complete_blocks` runs the draft over whatever it lacks in the blocks this step filled, so every block the prefix
cache can hand out holds both models' KV; tokens in a block not yet full may lag behind, and the next catch-up
runs them."""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch

from tally.core.kv_manager import KVCacheManager
from tally.core.request import Request
from tally.core.scheduler import SchedulerOutput
from tally.engine.draft_model import DraftModel
from tally.engine.inputs import build_span_inputs
from tally.engine.model_step import ModelStep, run_model_step
from tally.engine.runner import reads_outputs
from tally.sample.batch import SamplerInput
from tally.sample.sampler import Sampler
from tally.sampling_params import SamplingType


@dataclass
class DraftState:
    computed: int  # leading positions holding the draft's KV of the request's known tokens
    preemptions: int  # the request's num_preemptions when counted: preemption frees the blocks
    proposed: list[int] = field(default_factory=list)  # the last proposals; KV written for all but the last
    proposed_at: int = -1  # the request's num_tokens when proposed: they are verified only before it grows


class DraftProposer:
    def __init__(self, draft: DraftModel, kv: KVCacheManager) -> None:
        self.draft = draft
        self.kv = kv
        self.sampler = Sampler()  # its own: the draft's batches are not the target's
        self._states: weakref.WeakKeyDictionary[Request, DraftState] = weakref.WeakKeyDictionary()

    @torch.inference_mode()
    def propose(self, reqs: list[Request], ks: list[int],
                reserve_blocks: int) -> tuple[dict[str, list[int]], dict[str, torch.Tensor]]:
        """For each request up to its k proposals (none where their blocks cannot be had while `reserve_blocks`
        stay free): ({request id: proposals}, {request id: [k, V] q rows} of the sampled requests)."""
        chosen = [(r, k) for r, k in zip(reqs, ks) if k > 0 and self._allocate(r, k, reserve_blocks)]
        if not chosen:
            return {}, {}
        tables = [self.kv.block_table(r.request_id) for r, _ in chosen]
        spans = []
        for (req, _), table in zip(chosen, tables):
            start = min(self._state(req).computed, req.num_tokens - 1)  # at least the last token: its logits
            spans.append((table, start, req.token_ids[start:]))
        logits = self._forward(spans)
        proposals: list[list[int]] = [[] for _ in chosen]
        q_rows: list[list[torch.Tensor]] = [[] for _ in chosen]
        active = list(range(len(chosen)))
        for depth in range(max(k for _, k in chosen)):
            if depth:
                active = [i for i in active if chosen[i][1] > depth]
                logits = self._forward([(tables[i], chosen[i][0].num_tokens + depth - 1, proposals[i][-1:])
                                        for i in active])
            q = self.sampler.distribution(logits, self._sampler_input([chosen[i][0] for i in active],
                                                                      [proposals[i] for i in active]))
            tokens = torch.multinomial(q, 1).squeeze(1).tolist()  # a greedy row's q is its argmax's point mass
            for row, i in enumerate(active):
                proposals[i].append(tokens[row])
                if chosen[i][0].sampling_params.sampling_type != SamplingType.GREEDY:
                    q_rows[i].append(q[row])
        for (req, _), tokens in zip(chosen, proposals):
            state = self._state(req)
            state.computed, state.proposed, state.proposed_at = req.num_tokens, tokens, req.num_tokens
        ids = {req.request_id: tokens for (req, _), tokens in zip(chosen, proposals)}
        probs = {req.request_id: torch.stack(rows) for (req, _), rows in zip(chosen, q_rows) if rows}
        return ids, probs

    @torch.inference_mode()
    def complete_blocks(self, out: SchedulerOutput) -> None:
        """After verification (scheduled counts lowered to what was kept), before the blocks are registered: count the
        accepted proposals' KV, and run the draft over what it lacks in every block the target fills this step."""
        bs, spans = self.kv.block_size, []
        for s in out.scheduled:
            req = s.request
            state = self._state(req)
            end = req.num_computed_tokens + s.num_new_tokens  # what the target holds after this step
            n, proposed = req.num_tokens, state.proposed if state.proposed_at == req.num_tokens else []
            if proposed:  # this step's: the accepted ones (up to `end`) are the tokens after the known ones
                state.computed = max(state.computed, min(n + len(proposed) - 1, end))
            state.proposed = []
            full = end // bs * bs
            if state.computed < full:
                tokens = req.token_ids[state.computed:full] + proposed[max(0, state.computed - n):max(0, full - n)]
                spans.append((self.kv.block_table(req.request_id), state.computed, tokens))
                state.computed = full
        if spans:
            self._forward(spans, logits=False)

    def _state(self, req: Request) -> DraftState:
        """The request's draft state; a new or preempted request's starts at its computed tokens, which then hold
        only prefix-cache hits: blocks registered with the draft's KV in them."""
        state = self._states.get(req)
        if state is None or state.preemptions != req.num_preemptions:
            state = self._states[req] = DraftState(req.num_computed_tokens, req.num_preemptions)
        return state

    def _allocate(self, req: Request, k: int, reserve_blocks: int) -> bool:
        """The blocks for the request's verify step with k proposals (what the scheduler would allocate)."""
        new_blocks = self.kv.blocks_needed(req.num_tokens + k) - len(self.kv.block_table(req.request_id))
        if new_blocks > self.kv.pool.num_free_blocks - reserve_blocks:
            return False
        return self.kv.allocate(req, req.num_tokens + k - req.num_computed_tokens)

    def _forward(self, spans: list[tuple[list[int], int, list[int]]], logits: bool = True) -> torch.Tensor:
        """The draft over the spans; float32 logits at each span's last token."""
        ids, positions, meta, last_rows = build_span_inputs(spans, self.kv.block_size)
        rows = last_rows if logits else last_rows[:0]
        return run_model_step(self.draft.model, self.draft.kv_caches, ModelStep(ids, positions, meta, rows))

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
