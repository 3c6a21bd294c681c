"""Multi-step decode (vLLM's `num_scheduler_steps`): where a step holds nothing but greedy decodes, several decode
steps run in one native call (tally/native/kernels.c: tally_decode_greedy), so the interpreter's work per step
(scheduling, step inputs, sampling, outputs) is paid once a burst (docs/benchmarks.md#decode-roofline).

A burst hands a request its tokens together, so streams would see them in bursts: `tally serve` keeps one step
(its clients stream), LLM() takes 8 (nobody watches its tokens arrive). Greedy outputs are unchanged: each step is
the one-call decode step, and its argmax is the sampler's greedy rule. The call ends early once every request has
made a token that stops it (EOS, a stop id); otherwise the tokens after one that finishes a request (those, or a
stop string) are computed and dropped, and so are the KV entries they wrote."""
from __future__ import annotations

from tally.core.kv_manager import KVCacheManager
from tally.core.request import Request
from tally.core.scheduler import Scheduler, SchedulerOutput
from tally.sampling_params import SamplingType

# LLM()'s default: at 8 the interpreter's share of a step is already small (docs/benchmarks.md#decode-roofline), so
# longer bursts gain little, while the tokens computed past a stop string (up to this many minus one) keep growing.
OFFLINE_SCHEDULER_STEPS = 8


def burst_steps(out: SchedulerOutput, scheduler: Scheduler, kv: KVCacheManager, limit: int,
                max_model_len: int) -> int:
    """How many decode steps this step runs, `limit` at most: 1 unless every scheduled request is a plain greedy
    decode, nobody waits to start or for its prompt's pass (a burst would hold them back) and the pool has room
    for every request's tokens, which it then holds for them."""
    if limit <= 1 or not out.scheduled or out.preempted or scheduler.waiting or scheduler.held:
        return 1
    reqs = [s.request for s in out.scheduled]
    if any(s.num_new_tokens != 1 or not decodes_plainly(s.request) for s in out.scheduled):
        return 1
    steps = min(limit, *(min(r.max_tokens - r.num_output_tokens, max_model_len - r.num_tokens) for r in reqs))
    if steps <= 1:
        return 1
    if not all([kv.allocate(r, steps) for r in reqs]):  # every request tried: some may have taken their blocks
        for r in reqs:
            kv.allocate(r, 1)  # back to one token's room; blocks already taken stay with their request
        return 1
    return steps


def decodes_plainly(req: Request) -> bool:
    """A greedy decode whose next token is the argmax of the logits and nothing else: no penalties, logit edits, bad
    words, pending min_tokens, grammar, logprobs or proposals to verify."""
    p = req.sampling_params
    return (req.num_output_tokens > 0 and p.sampling_type is SamplingType.GREEDY and not p.has_penalties
            and p.logprobs is None and not p.logit_bias and not p.allowed_token_ids and not req.bad_words_token_ids
            and p.min_tokens <= req.num_output_tokens and not req.constrained and not req.spec_token_ids)
