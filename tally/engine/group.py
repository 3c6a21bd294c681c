"""A user's request: one prompt, n sampled sequences, and the timestamps users feel."""
from __future__ import annotations

from dataclasses import dataclass

from tally.engine.runner import PromptLogprobs as StepPromptLogprobs
from tally.engine.sequence import Sequence
from tally.outputs import Logprob, PromptLogprobs, RequestMetrics, RequestOutput


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
        ids = self.prompt_token_ids
        for j in range(step.token_logprobs.shape[0]):
            pos = step.start + j + 1
            entry = {ids[pos]: Logprob(float(step.token_logprobs[j]), int(step.ranks[j]), decode(ids[pos]))}
            if step.top_ids is not None:
                for rank, (tid, lp) in enumerate(zip(step.top_ids[j].tolist(), step.top_logprobs[j].tolist()), 1):
                    entry.setdefault(tid, Logprob(lp, rank, decode(tid)))
            self.prompt_logprobs.append(entry)

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

