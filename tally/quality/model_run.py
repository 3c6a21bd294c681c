"""One model through the whole workload: perplexity windows scored, every item decoded greedily.

Baseline and candidate run one after the other in this process (one model in memory at a time), with
the same Decoding, so any difference in the outputs is the model's.
"""
from __future__ import annotations

from dataclasses import dataclass, field
import time
from typing import TYPE_CHECKING

from tally.engine.llm import LLM
from tally.errors import ConfigError
from tally.quality.corrupt import corrupt
from tally.quality.settings import Decoding
from tally.quality.suites import Workload
from tally.sampling_params import SamplingParams

if TYPE_CHECKING:
    from tally.models.tokenizer import Tokenizer


@dataclass(frozen=True)
class ModelSpec:
    model: str | None  # as LLM(model=...): checkpoint dir, .gguf, alias, None for the built-in model
    quantization: str | None = None
    dtype: str = "auto"
    max_model_len: int | None = None
    kv_cache_memory: int | None = None
    kv_cache_dtype: str = "auto"
    corrupt: str | None = None  # e.g. "zero-layer:0"; see corrupt.py
    threads: int | None = None  # as LLM(threads=...): None, the physical cores

    def label(self) -> str:
        name = self.model or "built-in SmolLM2-135M"
        kv = f"kv {self.kv_cache_dtype}" if self.kv_cache_dtype != "auto" else None
        extra = [x for x in (self.quantization, self.dtype if self.dtype != "auto" else None, kv, self.corrupt) if x]
        return f"{name} ({', '.join(extra)})" if extra else name


@dataclass
class Generation:
    token_ids: list[int]
    text: str


@dataclass
class ModelRun:
    spec: ModelSpec
    nll_by_text: dict[str, tuple[float, int]] = field(default_factory=dict)  # text -> (sum of -log p, tokens)
    generations: dict[str, Generation] = field(default_factory=dict)  # item id -> greedy output
    run_s: float = 0.0


def open_model(spec: ModelSpec, decoding: Decoding, progress: bool = True) -> LLM:
    """`progress`: the weights' loading bar (vLLM's use_tqdm_on_load)."""
    llm = LLM(spec.model, dtype=spec.dtype, quantization=spec.quantization, max_model_len=spec.max_model_len,
              kv_cache_memory=spec.kv_cache_memory, kv_cache_dtype=spec.kv_cache_dtype, max_num_seqs=decoding.batch_size,
              max_num_batched_tokens=decoding.max_num_batched_tokens, threads=spec.threads,
              use_tqdm_on_load=progress)
    if spec.corrupt:
        corrupt(llm, spec.corrupt)
    return llm


def same_vocabulary(baseline_tok: Tokenizer, candidate_tok: Tokenizer) -> None:
    if baseline_tok.get_vocab() != candidate_tok.get_vocab():
        raise ConfigError("baseline and candidate have different tokenizers; perplexity and token agreement "
                          "only compare models that share one (quantize the baseline to make the candidate)")


def run_model(llm: LLM, spec: ModelSpec, workload: Workload, decoding: Decoding, progress: bool = True) -> ModelRun:
    """`progress`: LLM.generate's bar (with an ETA) on a terminal's stderr, for the scoring and the decoding."""
    t0 = time.perf_counter()
    nll: dict[str, tuple[float, int]] = {}
    if workload.ppl_windows:
        names = [n for n, ws in workload.ppl_windows.items() for _ in ws]
        windows = [w for ws in workload.ppl_windows.values() for w in ws]
        score_only = SamplingParams(max_tokens=0, prompt_logprobs=0)  # the chosen token's logprob, no decoding
        outs = llm.generate([{"prompt_token_ids": w} for w in windows], score_only, use_tqdm=progress)
        for name, ids, out in zip(names, windows, outs):
            total, count = nll.get(name, (0.0, 0))
            scored = [-lp[ids[i]].logprob for i, lp in enumerate(out.prompt_logprobs) if lp is not None]
            nll[name] = (total + sum(scored), count + len(scored))
    generations = {}
    if workload.items:
        params = SamplingParams(temperature=decoding.temperature, max_tokens=decoding.max_tokens)
        outs = llm.generate([{"prompt_token_ids": it.prompt_token_ids} for it in workload.items], params,
                            use_tqdm=progress)
        generations = {it.id: Generation(list(o.outputs[0].token_ids), o.outputs[0].text)
                       for it, o in zip(workload.items, outs)}
    return ModelRun(spec, nll, generations, run_s=time.perf_counter() - t0)
