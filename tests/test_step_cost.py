from __future__ import annotations

from tally.engine.step_cost import PROBE_TOKENS, StepCost


def _step_s(tokens: int, start: int) -> float:
    """100 ms fixed (decodes and a mixed step's overhead), 10 µs per token of context read back, 1 ms per prompt
    token, 1 µs per prompt token per token of context it attends."""
    return 0.100 + 1e-5 * start + sum(0.001 + 1e-6 * (start + i) for i in range(tokens))


def test_a_probe_chunk_until_steps_of_two_sizes_were_seen():
    cost = StepCost()
    assert cost.prompt_tokens_within(0.2, 0) == PROBE_TOKENS
    for _ in range(4):
        cost.observe(64, 32, _step_s(64, 0))
    assert cost.prompt_tokens_within(0.2, 0) == PROBE_TOKENS


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
