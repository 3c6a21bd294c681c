"""Speculative decoding: before a step, decoding requests get proposals (prompt lookup,
tally/engine/ngram_proposer.py, or a draft model, tally/engine/draft_proposer.py) as tokens the step computes after
their last one; after it, each proposal is checked against the token the target sampled at its place, and the
request keeps the proposals up to the first disagreement plus the target's own token there (one more than it
proposed when all held).

Exact for greedy and sampled requests alike: every position is sampled from the target's distribution (with
the proposals before it counted as output, for penalties and min_tokens), and a proposal is kept only when the
sample equals it. For a proposer that names one token (prompt lookup, or a draft model's argmax for a greedy
request), that is rejection sampling: accepted with probability p(x), and on rejection the sample is distributed
as p without x, renormalised — the residual distribution. A draft model's proposal for a sampled request is drawn
from its own distribution q; the sampler then keeps it with probability min(1, p(x)/q(x)) and otherwise samples
the residual norm(max(0, p - q)) (tally/sample/rejection.py), which again gives the target's distribution. A seeded
request is never speculated, so its tokens stay reproducible; nor is a constrained one (its matcher would have to
check the proposals first)."""
from __future__ import annotations

import torch

from tally.core.request import Request
from tally.core.scheduler import SchedulerOutput
from tally.engine.draft_proposer import DraftProposer
from tally.engine.ngram_proposer import propose_ngram
from tally.engine.speculation_policy import SpeculationPolicy
from tally.engine.speculation_stats import SpeculationStats
from tally.engine.speculative_config import SpeculativeConfig


class Speculator:
    def __init__(self, config: SpeculativeConfig, max_model_len: int, draft: DraftProposer | None = None) -> None:
        self.config = config
        self.max_model_len = max_model_len
        self.draft = draft  # method draft_model
        self.draft_probs: dict[str, torch.Tensor] = {}  # this step's q rows of sampled requests (draft model)
        self.policy = SpeculationPolicy()
        self.stats = SpeculationStats(accepted_per_position=[0] * config.num_speculative_tokens)

    def propose(self, running: list[Request]) -> None:
        """Give decoding requests the proposals this step will verify."""
        cfg = self.config
        for req in running:  # a request left out of the last step keeps no stale proposals
            if req.spec_token_ids:
                req.spec_token_ids = []
        self.draft_probs = {}
        if cfg.adaptive and not self.policy.speculate_now():
            return
        decoding = [r for r in running if r.num_computed_tokens == r.num_tokens - 1 and r.num_output_tokens > 0]
        candidates, limits = [], []
        for req in decoding:
            room = min(req.max_tokens - req.num_output_tokens, self.max_model_len - req.num_tokens) - 1
            if req.generator is None and req.grammar is None and room > 0:
                candidates.append(req)
                limits.append(min(room, cfg.num_speculative_tokens))
        if not candidates:
            return
        if self.draft is not None:  # the draft's forward passes cost: how many to verify is chosen first
            ks = self.policy.choose(limits) if cfg.adaptive else limits
            proposals, self.draft_probs = self.draft.propose(candidates, ks, reserve_blocks=len(running))
            for req in candidates:
                req.spec_token_ids = list(proposals.get(req.request_id, ()))  # the scheduler may trim it
            return
        proposals = [propose_ngram(req.token_ids, cfg.prompt_lookup_min, cfg.prompt_lookup_max, k)
                     for req, k in zip(candidates, limits)]
        counts = self.policy.choose([len(p) for p in proposals]) if cfg.adaptive else [len(p) for p in proposals]
        for req, tokens, k in zip(candidates, proposals, counts):
            req.spec_token_ids = tokens[:k]

    def verify(self, out: SchedulerOutput, sampled: list[Request], counts: list[int],
               token_ids: list[int]) -> list[int]:
        """After the forward pass, before the scheduler counts computed tokens: how many of each sampled request's
        rows (in sampler order) it keeps. A speculating request's scheduled count is lowered to the proposals it
        kept, so the rejected ones' cache slots count as empty (the next step writes over them)."""
        keep, row = [], 0
        kept: dict[int, int] = {}  # id(request) -> proposals kept, for requests that proposed
        for req, count in zip(sampled, counts):
            proposed = req.spec_token_ids
            accepted = 0
            while accepted < len(proposed) and token_ids[row + accepted] == proposed[accepted]:
                accepted += 1
            if proposed:
                self._record(len(proposed), accepted)
                kept[id(req)] = accepted
            keep.append(accepted + 1)
            row += count
        if kept:
            self.stats.last_num_speculative_tokens = sum(len(r.spec_token_ids) for r in sampled) / len(kept)
            for s in out.scheduled:
                if id(s.request) in kept:
                    s.num_new_tokens = s.request.num_tokens - s.request.num_computed_tokens + kept[id(s.request)]
                    s.request.spec_token_ids = []
        return keep

    def complete_blocks(self, out: SchedulerOutput) -> None:
        """After verify, before Scheduler.finish_step registers full blocks: a draft model's KV joins the target's in
        every block this step filled."""
        if self.draft is not None:
            self.draft.complete_blocks(out)

    def observe_step(self, generated_tokens: int, seconds: float, batch: int) -> None:
        self.policy.observe_step(generated_tokens, seconds, batch)

    def _record(self, proposed: int, accepted: int) -> None:
        st = self.stats
        st.num_drafts += 1
        st.num_draft_tokens += proposed
        st.num_accepted_tokens += accepted
        for j in range(accepted):
            st.accepted_per_position[j] += 1
