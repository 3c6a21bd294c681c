"""`LLM`: the offline API, with vLLM's names so code written for vLLM runs here."""
from __future__ import annotations

import itertools
import logging
from dataclasses import fields
from typing import Any, Sequence

from rich.console import Console
from rich.progress import Progress

from tally.engine.config import EngineConfig
from tally.engine.load_engine import load_engine
from tally.engine.multi_step import OFFLINE_SCHEDULER_STEPS
from tally.engine.scoring import cosine, pair_prompt, score_pairs
from tally.engine.vllm_compat import NO_EFFECT
from tally.errors import ConfigError, InvalidRequestError
from tally.lora_request import LoRARequest
from tally.models.chat_template import chat_prompt, refuse_without_template
from tally.outputs import EmbeddingRequestOutput, RequestOutput, ScoringOutput, ScoringRequestOutput
from tally.pooling_params import PoolingParams
from tally.sampling_params import SamplingParams

log = logging.getLogger("tally")
PromptType = str | dict[str, Any] | list[int]


class LLM:
    def __init__(self, model: str | None = None, **kwargs: Any) -> None:
        known = {f.name for f in fields(EngineConfig)}
        ignored = sorted(k for k in kwargs if k in NO_EFFECT)
        if ignored:
            log.warning("ignoring vLLM arguments that have no effect on this CPU engine: %s", ", ".join(ignored))
            kwargs = {k: v for k, v in kwargs.items() if k not in NO_EFFECT}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ConfigError(f"unknown LLM argument(s) {unknown}; known: {sorted(known)}")
        kwargs.setdefault("num_scheduler_steps", OFFLINE_SCHEDULER_STEPS)  # nobody streams from LLM()
        self.engine = load_engine(EngineConfig(model=model, **kwargs))
        self._ids = itertools.count()

    def get_tokenizer(self) -> Any:
        return self.engine.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """vLLM's: SamplingParams with the checkpoint's generation_config.json defaults (--generation-config)."""
        return SamplingParams(**self.engine.sampling_defaults)

    def generate(self, prompts: PromptType | Sequence[PromptType],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True, priority: Sequence[int] | None = None,
                 lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in prompt order. `use_tqdm` (vLLM's name): a progress
        bar of finished prompts on stderr while more than one runs. `priority`: one per prompt, lower sooner (needs
        scheduling_policy="priority", as vLLM's). `lora_request`: the adapter of every prompt, or one per prompt
        (None: the base model; needs enable_lora=True)."""
        self._check_task("generate", "generate")
        prompts = _prompt_list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or self.get_default_sampling_params()] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise InvalidRequestError(
                    f"got {len(params)} SamplingParams for {len(prompts)} prompts; pass one, or one per prompt")
        priorities = [0] * len(prompts) if priority is None else list(priority)
        if len(priorities) != len(prompts):
            raise InvalidRequestError(f"got {len(priorities)} priorities for {len(prompts)} prompts; pass one per "
                                      "prompt", param="priority")
        loras = [lora_request] * len(prompts) if lora_request is None or isinstance(lora_request, LoRARequest) \
            else list(lora_request)
        if len(loras) != len(prompts):
            raise InvalidRequestError(f"got {len(loras)} LoRA requests for {len(prompts)} prompts; pass one, or one "
                                      "per prompt", param="lora_request")
        return self._run(prompts, params, use_tqdm, priorities, loras)

    def embed(self, prompts: PromptType | Sequence[PromptType], pooling_params: PoolingParams | None = None,
              use_tqdm: bool = True, truncate_prompt_tokens: int | None = None) -> list[EmbeddingRequestOutput]:
        """vLLM's `LLM.embed`: each prompt's pooled vector (`outputs.embedding`), in prompt order."""
        self._check_task("embed", "embed")
        params = pooling_params or PoolingParams()
        if truncate_prompt_tokens is not None:
            params = PoolingParams(params.dimensions, params.normalize, truncate_prompt_tokens)
        prompts = _prompt_list(prompts)
        return self._run(prompts, [params] * len(prompts), use_tqdm)

    def score(self, data_1: str | Sequence[str], data_2: str | Sequence[str], use_tqdm: bool = True,
              truncate_prompt_tokens: int | None = None) -> list[ScoringRequestOutput]:
        """vLLM's `LLM.score`, one `data_1` against every `data_2` or pairwise: a cross-encoder's score of each pair,
        or with an embedding model the cosine of each pair's embeddings."""
        cross_encoder = "score" in self.engine.supported_tasks
        if not cross_encoder:
            self._check_task("embed", "score")
        pairs = score_pairs(data_1, data_2, str, ("data_1", "data_2"))
        if cross_encoder:
            prompts = [pair_prompt(self.engine.tokenizer, a, b, self.engine.max_model_len, "data_2",
                                   truncate_prompt_tokens) for a, b in pairs]
            return [ScoringRequestOutput(o.request_id, o.prompt_token_ids, ScoringOutput(o.outputs.embedding[0]))
                    for o in self._run(prompts, [PoolingParams()] * len(prompts), use_tqdm)]
        texts = list(dict.fromkeys(t for pair in pairs for t in pair))  # each text embedded once
        outs = dict(zip(texts, self.embed(texts, use_tqdm=use_tqdm, truncate_prompt_tokens=truncate_prompt_tokens)))
        return [ScoringRequestOutput(f"{outs[a].request_id}_{outs[b].request_id}",
                                     outs[a].prompt_token_ids + outs[b].prompt_token_ids,
                                     ScoringOutput(cosine(outs[a].outputs.embedding, outs[b].outputs.embedding)))
                for a, b in pairs]

    def _check_task(self, task: str, method: str) -> None:
        if task not in self.engine.supported_tasks:
            other = "--runner pooling (runner=\"pooling\")" if task == "embed" else "--runner generate"
            if "score" in self.engine.supported_tasks:
                other = "an embedding model: this one is a cross-encoder, which scores pairs (LLM.score)"
            raise InvalidRequestError(f"LLM.{method}() needs a model served for {task!r}; this one serves "
                                      f"{list(self.engine.supported_tasks)}; load it with {other}")

    def _run(self, prompts: list[PromptType], params: list[SamplingParams] | list[PoolingParams],
             use_tqdm: bool, priorities: list[int] | None = None,
             loras: list[LoRARequest | None] | None = None) -> list[Any]:
        ids = [f"offline-{next(self._ids)}" for _ in prompts]
        added = []
        try:
            for rid, prompt, p, rank, lora in zip(ids, prompts, params, priorities or [0] * len(prompts),
                                                  loras or [None] * len(prompts)):
                self.engine.add_request(rid, prompt, p, priority=rank, lora_request=lora)
                added.append(rid)
        except Exception:
            for rid in added:
                self.engine.abort_request(rid)
            self.engine.step()  # emits the aborts, frees nothing twice
            raise
        if use_tqdm and len(ids) > 1:
            with Progress(*Progress.get_default_columns(), console=Console(stderr=True), transient=True) as bar:
                task = bar.add_task("Processed prompts", total=len(ids))
                final = self.engine.run_until_done(lambda _: bar.advance(task))
        else:
            final = self.engine.run_until_done()
        return [final[rid] for rid in ids]

    def chat(self, messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, use_tqdm: bool = True,
             chat_template: str | None = None, add_generation_prompt: bool = True,
             continue_final_message: bool = False, chat_template_kwargs: dict[str, Any] | None = None,
             lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None) -> list[RequestOutput]:
        """vLLM's `LLM.chat`: one conversation or a list of them, through the model's chat template (or
        `chat_template`), `chat_template_kwargs` passed to the template; `lora_request` as generate's."""
        conversations = messages if messages and isinstance(messages[0], list) else [messages]
        tok = self.get_tokenizer()
        prompts = [chat_prompt(tok, c, without_template=refuse_without_template, chat_template=chat_template,
                               add_generation_prompt=add_generation_prompt,
                               continue_final_message=continue_final_message, template_kwargs=chat_template_kwargs)
                   for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm, lora_request=lora_request)


def _prompt_list(prompts: PromptType | Sequence[PromptType]) -> list[PromptType]:
    if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
        return [prompts]
    return list(prompts)
