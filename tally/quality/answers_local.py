"""Answers from a model loaded in this process (as the built-in gate loads them, tally/quality/model_run.py): a
`prompt` is completed as it is, `messages` go through the model's chat template."""
from __future__ import annotations

from dataclasses import asdict
from typing import Any

from tally.errors import TallyError
from tally.quality.answers import Answer, item_seed
from tally.quality.model_run import ModelSpec, open_model
from tally.quality.settings import Decoding
from tally.quality.suite_file import SuiteItem
from tally.quality.suites import chat_ids
from tally.sampling_params import SamplingParams


class LocalAnswers:
    def __init__(self, spec: ModelSpec, batch_size: int, progress: bool) -> None:
        self.spec = spec
        self.llm = open_model(spec, Decoding(batch_size=batch_size), progress)
        self.progress = progress

    def describe(self) -> dict[str, Any]:
        return {"kind": "local", "label": self.spec.label(), **asdict(self.spec),
                "max_model_len": self.llm.engine.max_model_len}

    def _prompt(self, item: SuiteItem) -> str | dict[str, Any]:
        if item.prompt is not None:
            return item.prompt
        return {"prompt_token_ids": chat_ids(self.llm.get_tokenizer(), list(item.messages or ()))}

    @staticmethod
    def _params(item: SuiteItem) -> SamplingParams:
        d = item.decoding
        return SamplingParams(temperature=d.temperature, top_p=d.top_p, max_tokens=d.max_tokens, seed=item_seed(item))

    def _generate(self, items: list[SuiteItem]) -> list[Answer]:
        outs = self.llm.generate([self._prompt(it) for it in items], [self._params(it) for it in items],
                                 use_tqdm=self.progress)
        return [Answer(o.outputs[0].text, len(o.outputs[0].token_ids)) for o in outs]

    def answer(self, items: list[SuiteItem]) -> list[Answer]:
        try:
            return self._generate(items)
        except TallyError:
            pass  # one item the engine refuses (too long, ...) refuses the batch: find it, answer the others
        answers = []
        for it in items:
            try:
                answers += self._generate([it])
            except TallyError as e:
                answers.append(Answer("", 0, e.message))
        return answers
