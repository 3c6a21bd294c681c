"""A user's request: one prompt, n sampled sequences, and the timestamps users feel."""
from __future__ import annotations

from dataclasses import dataclass

from tally.engine.runner import PromptLogprobs as StepPromptLogprobs
from tally.engine.sequence import Sequence
from tally.outputs import PromptLogprobs, RequestMetrics, RequestOutput, logprob_entry


@dataclass
class RequestGroup:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    sequences: list[Sequence]
    metrics: RequestMetrics
    prompt_logprobs: PromptLogprobs | None = None

    @property
    def finished(self) -> bool:
        return all(s.finish_reason is not None for s in self.sequences)

    def add_prompt_logprobs(self, step: StepPromptLogprobs, decode) -> None:
        """Fold one prefill chunk's prompt logprobs in (entry i+1 scores prompt token i+1)."""
        if self.prompt_logprobs is None:
            self.prompt_logprobs = [None]
        del self.prompt_logprobs[step.start + 1:]  # a request preempted by recompute scores its prompt again
        ids = self.prompt_token_ids
        chosen, ranks = step.token_logprobs.tolist(), step.ranks.tolist()
        top_ids = step.top_ids.tolist() if step.top_ids is not None else [()] * len(chosen)
        top_lps = step.top_logprobs.tolist() if step.top_logprobs is not None else [()] * len(chosen)
        for j in range(len(chosen)):
            self.prompt_logprobs.append(
                logprob_entry(ids[step.start + j + 1], chosen[j], ranks[j], top_ids[j], top_lps[j], decode))

    def output(self) -> RequestOutput:
        seqs = self.sequences
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            prompt_logprobs=self.prompt_logprobs,
            outputs=[s.output() for s in seqs],
            finished=self.finished,
            metrics=self.metrics,
            num_cached_tokens=max(0, seqs[0].request.num_cached_tokens),
        )

