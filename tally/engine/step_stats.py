"""What the engine counts of its steps: tokens, decode-only seconds, tokens per step, and the fitted step cost the
--max-itl planner and the swap space read."""
from __future__ import annotations

from tally.core.scheduler import SchedulerOutput
from tally.engine.snapshot import IterationTokens
from tally.engine.step_cost import StepCost


def prompt_chunks(out: SchedulerOutput) -> list[tuple[int, int]]:
    """Each scheduled prompt chunk's (tokens, context it starts at); read before the step advances them."""
    return [(s.num_new_tokens, s.request.num_computed_tokens) for s in out.scheduled
            if s.num_new_tokens > 1 and not s.request.spec_token_ids]


def mean_context(chunks: list[tuple[int, int]]) -> float:
    """The context the chunks' prompt tokens attend, on average."""
    tokens = sum(n for n, _ in chunks)
    return sum(n * (start + n / 2) for n, start in chunks) / tokens if tokens else 0.0


class StepStats:
    def __init__(self) -> None:
        self.num_steps = 0
        self.prompt_tokens = self.generated_tokens = 0
        # Steps without a prompt chunk: their seconds and generated tokens (decode's own speed, which speculation
        # changes, apart from the prompts' prefill that shares a run's time with it)
        self.decode_step_seconds, self.decode_step_tokens = 0.0, 0
        self.iteration_tokens = IterationTokens()  # tokens per step, for vLLM's iteration_tokens_total
        self.cost = StepCost()
        self.last_decode_step_s = 0.0  # the last decode-only step's seconds (a burst: per decode step)

    def record(self, chunks: list[tuple[int, int]], generated: int, seconds: float, decode_steps: int) -> bool:
        """A step that ran `chunks` (prompt_chunks) and generated `generated` tokens in `seconds`, over
        `decode_steps` decode steps (a burst runs several in one call). True when it was decode-only: only such a
        step says anything about decode's speed, or speculation's."""
        prompt_tokens = sum(n for n, _ in chunks)
        self.prompt_tokens += prompt_tokens
        self.generated_tokens += generated
        self.iteration_tokens = self.iteration_tokens.observe(prompt_tokens + generated)
        self.cost.observe(prompt_tokens, mean_context(chunks), seconds / decode_steps)  # a burst: per decode step
        if chunks:
            return False
        self.decode_step_seconds += seconds
        self.decode_step_tokens += generated
        self.last_decode_step_s = seconds / decode_steps
        return True

    def record_pass(self, chunks: list[tuple[int, int]], generated: int, seconds: float) -> None:
        """A prompt pass run in slices beside decode steps (tally/engine/prompt_pass.py) ended: its `chunks` took
        `seconds` of its own, over all its slices, and made `generated` first tokens."""
        prompt_tokens = sum(n for n, _ in chunks)
        self.prompt_tokens += prompt_tokens
        self.generated_tokens += generated
        self.cost.observe(prompt_tokens, mean_context(chunks), seconds)
