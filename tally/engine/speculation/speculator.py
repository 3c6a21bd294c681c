"""Speculative decoding: before a step, decoding requests get proposals (prompt lookup,
tally/engine/speculation/ngram_proposer.py, or a draft model, tally/engine/speculation/draft_proposer.py) as tokens the
step computes after their last one; after it, each proposal is checked against the token the target sampled at its
place, and the request keeps the proposals up to the first disagreement plus the target's own token there (one more than
it proposed when all held)."""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass
from itertools import takewhile

import numpy as np
import torch

from tally.core.request import Request, RequestStatus
from tally.core.scheduler import SchedulerOutput
from tally.engine.speculation.config import DRAFT_SHARE, SpeculativeConfig
from tally.engine.speculation.draft_proposer import DraftProposer
from tally.engine.speculation.ngram_proposer import propose_ngram
from tally.engine.speculation.policy import SpeculationPolicy
from tally.engine.speculation.stats import SpeculationStats

# A request's acceptance: its own verifications, older ones fading by DECAY each, beside PRIOR verifications' worth
# of every request's (a new request starts from what the others measured).
DECAY = 0.9
PRIOR = 4.0


@dataclass
class Acceptance:
    """Counts apart for the first proposal and for those after a kept one: once a proposal holds, the next holds far
    more often than the first does, so one rate for every position, raised to the j-th power, undervalues the later
    proposals (docs/benchmarks.md#speculative-decoding)."""

    first_kept: float = 0.0
    first_judged: float = 0.0  # verifications (each judges its first proposal)
    next_kept: float = 0.0  # proposals after the first kept
    next_judged: float = 0.0  # proposals after the first whose predecessor was kept

    def add(self, proposed: int, kept: int, decay: float = 1.0) -> None:
        self.first_kept = decay * self.first_kept + (kept > 0)
        self.first_judged = decay * self.first_judged + 1
        self.next_kept = decay * self.next_kept + max(kept - 1, 0)
        self.next_judged = decay * self.next_judged + min(kept, proposed - 1)


class Speculator:
    """Exact for greedy and sampled requests alike: every position is sampled from the target's distribution (with
    the proposals before it counted as output, for penalties and min_tokens), and a proposal is kept only when the
    sample equals it. For a proposer that names one token (prompt lookup, or a draft model's argmax for a greedy
    request), that is rejection sampling: accepted with probability p(x), and on rejection the sample is distributed
    as p without x, renormalised — the residual distribution. A draft model's proposal for a sampled request is drawn
    from its own distribution q; the sampler then keeps it with probability min(1, p(x)/q(x)) and otherwise samples
    the residual norm(max(0, p - q)) (tally/sample/rejection.py), which again gives the target's distribution. A seeded
    request is never speculated, so its tokens stay reproducible; nor is a constrained one (its matcher would have to
    check the proposals first)."""
    def __init__(self, config: SpeculativeConfig, max_model_len: int, draft: DraftProposer | None = None) -> None:
        self.config = config
        self.max_model_len = max_model_len
        self.draft = draft  # method draft_model
        self.draft_probs: dict[str, torch.Tensor] = {}  # this step's q rows of sampled requests (draft model)
        self.policy = SpeculationPolicy()
        self.stats = SpeculationStats(accepted_per_position=[0] * config.num_speculative_tokens)
        self._acceptance: weakref.WeakKeyDictionary[Request, Acceptance] = weakref.WeakKeyDictionary()
        self._overall = Acceptance()  # every request's, undecayed
        self.step_proposals = 0  # proposals the current step verifies
        self._step_passes = 0  # the most any request verifies: the draft's passes for them
        self.step_proposing_s = 0.0  # what the current step's propose() took, less the draft's own work
        self._drafting_s = 0.0  # of that, the draft's passes and catch-up (priced apart: per pass, per request)
        self._running: list[Request] = []  # the last step's, to see which finished since
        self.mean_output_tokens: float | None = None  # finished requests' outputs, recent ones weighing most

    def propose(self, running: list[Request]) -> None:
        """Give decoding requests the proposals this step will verify; timed, for the policy (what proposing costs
        a step whether or not it verifies any)."""
        started_s = time.perf_counter()
        self._drafting_s = 0.0
        self._propose(running)
        self.step_proposing_s = time.perf_counter() - started_s - self._drafting_s

    def _propose(self, running: list[Request]) -> None:
        cfg = self.config
        for req in running:  # a request left out of the last step keeps no stale proposals
            if req.spec_token_ids:
                req.spec_token_ids = []
        self._count_finished(running)
        if self.draft is not None:
            self.draft.forget(running)
        self.draft_probs = {}
        self.step_proposals = self._step_passes = 0
        if cfg.adaptive and not self.policy.speculate_now():
            return
        candidates, limits, rooms = [], [], []
        for req in running:
            room = min(req.max_tokens - req.num_output_tokens, self.max_model_len - req.num_tokens) - 1
            if (req.num_computed_tokens == req.num_tokens - 1 and req.num_output_tokens > 0 and room > 0
                    and req.generator is None and not req.constrained):
                candidates.append(req)
                limits.append(min(room, cfg.num_speculative_tokens))
                rooms.append(room)
        if self.draft is None and cfg.adaptive and (theta := self.policy.proposal_tokens()) > 0 and candidates:
            # the search over every request is what proposing costs a step: left out where no proposal would pay
            hopeful = (self.worth(candidates, 1)[:, 0] >= theta).tolist()
            candidates, limits, rooms = ([x for x, h in zip(xs, hopeful) if h] for xs in (candidates, limits, rooms))
        if not candidates:
            return
        if self.draft is not None:  # the draft's forward passes cost: how many to verify is chosen first
            ks = self._verified(candidates, np.array(limits), np.array(rooms, dtype=np.float64))
            drafting_s = time.perf_counter()
            proposals, self.draft_probs = self.draft.propose(candidates, ks.tolist())
            self._drafting_s = time.perf_counter() - drafting_s
            for req in candidates:
                req.spec_token_ids = list(proposals.get(req.request_id, ()))  # the scheduler may trim it
            return
        proposals = [propose_ngram(req.token_ids, cfg.prompt_lookup_min, cfg.prompt_lookup_max, k)
                     for req, k in zip(candidates, limits)]
        ks = self._verified(candidates, np.array([len(p) for p in proposals]), np.array(rooms, dtype=np.float64))
        for req, tokens, k in zip(candidates, proposals, ks.tolist()):
            req.spec_token_ids = tokens[:k]

    def _count_finished(self, running: list[Request]) -> None:
        for req in self._running:
            if req.status.finished and req.status != RequestStatus.FINISHED_ABORTED:
                mean = self.mean_output_tokens
                n = req.num_output_tokens
                self.mean_output_tokens = n if mean is None else DECAY * mean + (1 - DECAY) * n
        self._running = list(running)

    def _verified(self, reqs: list[Request], limits: np.ndarray, rooms: np.ndarray) -> np.ndarray:
        """How many proposals each request verifies, at most its limit: the policy's choice from each request's
        acceptance (and, with a draft model, what starting on it costs against the tokens it may still make), or
        every one with "adaptive": false."""
        if not self.config.adaptive:
            return limits
        worth = self.worth(reqs, int(limits.max(initial=0)))
        if self.draft is None:
            return self.policy.choose(worth, limits)
        lags = np.array([self.draft.lag(r) for r in reqs])
        mean = self.mean_output_tokens
        few = np.sort(np.argsort(lags, kind="stable")[:len(reqs) // DRAFT_SHARE]) if len(reqs) >= DRAFT_SHARE \
            else np.arange(len(reqs))
        ks = np.zeros_like(limits)
        ks[few] = self.policy.choose(worth[few], limits[few], self.draft.start_seconds(lags[few]),
                                     (rooms if mean is None else np.minimum(rooms, mean))[few])
        return ks

    def worth(self, reqs: list[Request], k: int) -> np.ndarray:
        """[request, j]: the expected tokens the request's (j + 1)-th proposal adds, the chance that it and every one
        before it hold: f · g^j, f its first proposal's acceptance and g a later one's after a kept predecessor."""
        o = self._overall
        f0, g0 = (o.first_kept + 1) / (o.first_judged + 2), (o.next_kept + 1) / (o.next_judged + 2)
        counts = np.array([(a.first_kept, a.first_judged, a.next_kept, a.next_judged)
                           if (a := self._acceptance.get(r)) else (0.0,) * 4 for r in reqs]).reshape(len(reqs), 4)
        f = (counts[:, 0] + PRIOR * f0) / (counts[:, 1] + PRIOR)
        g = (counts[:, 2] + PRIOR * g0) / (counts[:, 3] + PRIOR)
        return f[:, None] * g[:, None] ** np.arange(k)

    def verify(self, out: SchedulerOutput, sampled: list[Request], counts: list[int],
               token_ids: list[int]) -> list[int]:
        """After the forward pass, before the scheduler counts computed tokens: how many of each sampled request's
        rows (in sampler order) it keeps. A speculating request's scheduled count is lowered to the proposals it
        kept, so the rejected ones' cache slots count as empty (the next step writes over them)."""
        keep, row = [], 0
        kept: dict[int, int] = {}  # id(request) -> proposals kept, for requests that proposed
        for req, count in zip(sampled, counts):
            proposed = req.spec_token_ids
            accepted = sum(1 for _ in takewhile(bool, map(int.__eq__, proposed, token_ids[row:row + count])))
            if proposed:
                self._record(req, len(proposed), accepted)
                kept[id(req)] = accepted
                if self.draft is not None:
                    self.draft.record_kept(req, accepted)
            keep.append(accepted + 1)
            row += count
        if kept:
            self.step_proposals = sum(len(r.spec_token_ids) for r in sampled)
            # a draft's forward passes, one per depth; prompt lookup runs nothing per depth
            self._step_passes = max(len(r.spec_token_ids) for r in sampled) if self.draft is not None else 0
            self.stats.last_num_speculative_tokens = self.step_proposals / len(kept)
            for s in out.scheduled:
                if id(s.request) in kept:
                    s.num_new_tokens = s.request.num_tokens - s.request.num_computed_tokens + kept[id(s.request)]
                    s.request.spec_token_ids = []
        return keep

    def observe_step(self, generated_tokens: int, seconds: float, batch: int, steps: int = 1) -> None:
        """A step without a prompt chunk, for the policy, with what the draft spent in it catching up on requests
        (priced per request before it starts on one, not as part of a proposal's price) and what proposing took; a
        burst of `steps` decode steps without proposals (tally/engine/multi_step.py) counts as that many steps of its
        mean."""
        catch_up_s = self.draft.last_catch_up_seconds if self.draft is not None and self.step_proposals else 0.0
        for _ in range(steps):
            self.policy.observe_step(generated_tokens / steps, seconds / steps, batch, self.step_proposals,
                                     self._step_passes, catch_up_s, self.step_proposing_s / steps)

    def _record(self, req: Request, proposed: int, accepted: int) -> None:
        st = self.stats
        st.num_drafts += 1
        st.num_draft_tokens += proposed
        st.num_accepted_tokens += accepted
        for j in range(accepted):
            st.accepted_per_position[j] += 1
        self._acceptance.setdefault(req, Acceptance()).add(proposed, accepted, DECAY)
        self._overall.add(proposed, accepted)
