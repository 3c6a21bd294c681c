from __future__ import annotations

import random

from tally.engine.step_cost import HISTORY, PROBE_TOKENS, StepCost


def _step_s(tokens: int, start: int) -> float:
    """100 ms fixed (decodes and a mixed step's overhead), 10 µs per token of context read back, 1 ms per prompt
    token, 1 µs per prompt token per token of context it attends."""
    return 0.100 + 1e-5 * start + sum(0.001 + 1e-6 * (start + i) for i in range(tokens))


def test_probe_chunks_alternate_in_size_until_the_fit_separates_the_parts():
    cost = StepCost()
    start, sizes = 0, []
    while len(sizes) < 4:
        tokens = cost.prompt_tokens_within(0.2, start)
        sizes.append(tokens)
        cost.observe(tokens, start + tokens / 2, _step_s(tokens, start))
        start += tokens
    assert sizes == [PROBE_TOKENS, PROBE_TOKENS // 2, PROBE_TOKENS, PROBE_TOKENS // 2]
    assert cost.prompt_tokens_within(0.2, start) not in (PROBE_TOKENS, PROBE_TOKENS // 2)  # fitted now


def test_one_probe_size_alone_never_fits():
    cost = StepCost()
    for _ in range(6):
        cost.observe(64, 32, _step_s(64, 0))
    assert cost.prompt_tokens_within(0.2, 0) in (PROBE_TOKENS, PROBE_TOKENS // 2)


def test_prompt_tokens_fill_the_time_left_as_attention_grows():
    cost = StepCost()
    start = 0
    for tokens in (64, 80, 40, 120, 90, 30, 110, 70):
        cost.observe(tokens, start + tokens / 2, _step_s(tokens, start))
        start += tokens
    for context in (0, 600, 2000):
        fits = cost.prompt_tokens_within(0.2, context)
        assert _step_s(fits, context) <= 0.2 + 1e-6 < _step_s(fits + 2, context), context
    assert cost.prompt_tokens_within(0.2, 2000) < cost.prompt_tokens_within(0.2, 0)
    assert cost.prompt_tokens_within(0.09, 0) == 0  # the fixed part alone is over


def test_steps_slower_than_predicted_shrink_the_plan_so_slow_steps_still_fit():
    quiet, noisy = StepCost(), StepCost()
    rng = random.Random(0)
    start = 0
    for _ in range(HISTORY):
        tokens = rng.randrange(30, 120)
        quiet.observe(tokens, start + tokens / 2, _step_s(tokens, start))
        # A third of the steps run 1.5x slower, as on a CPU shared with other work.
        noisy.observe(tokens, start + tokens / 2, _step_s(tokens, start) * (1.5 if rng.random() < 1 / 3 else 1.0))
        start += tokens
    assert quiet.jitter() < 1.05
    assert noisy.jitter() > 1.2
    fits = noisy.prompt_tokens_within(0.2, start)
    assert _step_s(fits, start) * 1.2 <= 0.2
    assert fits < quiet.prompt_tokens_within(0.2, start)
