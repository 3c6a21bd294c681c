"""`LLM`: the offline API, with vLLM's names so code written for vLLM runs here."""
from __future__ import annotations

import itertools
from dataclasses import fields
from typing import Any, Sequence

from tally.engine.config import EngineConfig
from tally.engine.engine import Engine
from tally.errors import ConfigError, InvalidRequestError
from tally.models.chat_template import chat_prompt, refuse_without_template
from tally.outputs import RequestOutput
from tally.sampling_params import SamplingParams

PromptType = str | dict[str, Any] | list[int]


class LLM:
    def __init__(self, model: str | None = None, **kwargs: Any) -> None:
        known = {f.name for f in fields(EngineConfig)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ConfigError(f"unknown LLM argument(s) {unknown}; known: {sorted(known)}")
        self.engine = Engine(EngineConfig(model=model, **kwargs))
        self._ids = itertools.count()

    def get_tokenizer(self) -> Any:
        return self.engine.tokenizer

    def generate(self, prompts: PromptType | Sequence[PromptType],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in prompt order."""
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise InvalidRequestError(
                    f"got {len(params)} SamplingParams for {len(prompts)} prompts; pass one, or one per prompt")
        ids = [f"offline-{next(self._ids)}" for _ in prompts]
        added = []
        try:
            for rid, prompt, p in zip(ids, prompts, params):
                self.engine.add_request(rid, prompt, p)
                added.append(rid)
        except Exception:
            for rid in added:
                self.engine.abort_request(rid)
            self.engine.step()  # emits the aborts, frees nothing twice
            raise
        final = self.engine.run_until_done()
        return [final[rid] for rid in ids]

    def chat(self, messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[RequestOutput]:
        conversations = messages if messages and isinstance(messages[0], list) else [messages]
        tok = self.get_tokenizer()
        prompts = [chat_prompt(tok, c, without_template=refuse_without_template) for c in conversations]
        return self.generate(prompts, sampling_params)
