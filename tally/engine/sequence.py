"""What the engine keeps per generated sequence beside the scheduler's Request: its text so far,
stop-string state, logprobs, and how it finished."""
from __future__ import annotations

from dataclasses import dataclass

from tally.core.request import Request, RequestStatus
from tally.engine.detokenizer import IncrementalDetokenizer
from tally.engine.stop import StopChecker
from tally.outputs import CompletionOutput, Logprob


@dataclass
class Sequence:
    request: Request
    index: int  # which of the group's n samples
    detokenizer: IncrementalDetokenizer
    stop: StopChecker | None
    logprobs: list[dict[int, Logprob]] | None = None
    cumulative_logprob: float = 0.0
    text: str = ""
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def append(self, token_id: int, logprob: float, top: dict[int, Logprob] | None,
               max_model_len: int) -> bool:
        """Add one sampled token; returns True when the sequence is finished by it."""
        req, params = self.request, self.request.sampling_params
        if req.max_tokens == 0:  # prompt scoring only (echo + logprobs): the sampled token is not kept
            return self._finish("length", None)
        req.append_token(token_id)
        self.cumulative_logprob += logprob
        if self.logprobs is not None and top is not None:
            self.logprobs.append(top)
        delta = self.detokenizer.push([token_id])
        self.text = self.detokenizer.text
        n_out = req.num_output_tokens
        if n_out >= params.min_tokens:
            if token_id in req.eos_token_ids:
                return self._finish("stop", None)
            if params.stop_token_ids and token_id in params.stop_token_ids:
                return self._finish("stop", token_id)
            if self.stop is not None:
                stop_str, truncate_to = self.stop.check(self.text, len(delta))
                if stop_str is not None:
                    self.text = self.text[:truncate_to]
                    return self._finish("stop", stop_str)
        if n_out >= req.max_tokens or req.num_tokens >= max_model_len:
            return self._finish("length", None)
        return False

    def stop_by_grammar(self) -> bool:
        """The structured output is complete: nothing more may follow."""
        return self._finish("stop", None)

    def _finish(self, reason: str, stop_reason: int | str | None) -> bool:
        self.finish_reason, self.stop_reason = reason, stop_reason
        if not isinstance(stop_reason, str):  # a stop string already cut the text; else show all of it
            self.detokenizer.flush()
            self.text = self.detokenizer.text
        return True

    @property
    def status(self) -> RequestStatus:
        return {"stop": RequestStatus.FINISHED_STOPPED, "length": RequestStatus.FINISHED_LENGTH,
                "abort": RequestStatus.FINISHED_ABORTED}[self.finish_reason]

    def visible_text(self) -> str:
        """While running, a tail that may still turn into a stop string is not shown yet."""
        if self.finish_reason is not None or self.stop is None:
            return self.text
        return self.text[:len(self.text) - self.stop.holdback_len(self.text)]

    def output(self) -> CompletionOutput:
        return CompletionOutput(
            index=self.index,
            text=self.visible_text(),
            token_ids=list(self.request.output_token_ids),  # a snapshot: the live list keeps growing
            cumulative_logprob=self.cumulative_logprob if self.logprobs is not None else None,
            logprobs=self.logprobs,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
        )
