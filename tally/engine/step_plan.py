"""How many tokens the next step may hold while streams decode (--max-itl): no more prompt tokens than fit the latency
target by the measured step cost, and no more than spread each waiting prompt's prefill over PREFILL_SPREAD_STEPS
steps, so the streams' gaps stay even (many steps a little longer than a decode) instead of a few long steps and
then none."""
from __future__ import annotations

import math
from collections.abc import Iterable

from tally.core.request import Request
from tally.engine.step_cost import StepCost

# Steps are planned to take this share of --max-itl: steps of the same size vary by a third on a shared 2-core
# CPU (`python benchmarks/long_prompt_itl.py`), and the target is a bound on the gap, not its mean.
PLANNED_SHARE_OF_ITL = 0.75
# A prompt's prefill beside decoding streams takes about this many steps where the target would allow fewer: a long
# step is a gap every stream feels, and the ITL tail is the share of steps that carry a big chunk
# (docs/benchmarks.md#latency-under-load). A prompt too long for that at the target still goes at the target's pace.
PREFILL_SPREAD_STEPS = 32


def token_budget(running: list[Request], waiting: Iterable[Request], cost: StepCost, max_itl_s: float | None,
                 block_size: int) -> int | None:
    """The tokens the next step may hold: the decodes (and their proposals), plus prompt tokens within the target
    (never fewer than one block, so a long prompt still moves) and within the spread; None: no bound (no target, or
    nobody decoding)."""
    if max_itl_s is None:
        return None
    decoding = sum(1 + len(r.spec_token_ids) for r in running if r.num_output_tokens > 0)
    if decoding == 0:
        return None  # nobody is waiting for a next token
    # Where the next chunk starts: the prompt being chunked, else a new one (from its start).
    context = max((r.num_computed_tokens for r in running if r.num_output_tokens == 0), default=0)
    within_target = max(cost.prompt_tokens_within(max_itl_s * PLANNED_SHARE_OF_ITL, context), block_size)
    # Whole prompts, not what is left of them: a prompt's chunks stay one size, with no long tail of small ones.
    pending = sum(r.num_tokens for r in running if r.num_tokens - r.num_computed_tokens > 1)
    pending += sum(r.num_tokens for r in waiting)
    return decoding + min(within_target, max(1, math.ceil(pending / PREFILL_SPREAD_STEPS)))
