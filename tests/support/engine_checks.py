"""Shared pieces of the engine tests: the transformers oracle (greedy tokens, sampled distributions) and a block-leak
check."""
from __future__ import annotations

import inspect
import math
from collections import Counter
from pathlib import Path

import torch

from tally import SamplingParams
from support.tiny_models import auto_model_class


def hf_greedy(model_dir, prompt_ids: list[int], max_new_tokens: int) -> tuple[list[int], list[float]]:
    """Greedy tokens and their logprobs from Hugging Face transformers' own forward and cache, one
    request at a time, no EOS handling (generate() would mask EOS under min_new_tokens). `model_dir`
    is a checkpoint directory or an already loaded transformers model."""
    model = model_dir if isinstance(model_dir, torch.nn.Module) else _hf_model(model_dir)
    # the last position's logits only, as generate() asks: every row of a long prompt over Gemma 3's 262k-token
    # vocabulary would be about half of this oracle's work
    last_only = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    out, logprobs = [], []
    step_ids, past = torch.tensor([list(prompt_ids)]), None
    with torch.no_grad():
        for _ in range(max_new_tokens):
            res = model(step_ids, past_key_values=past, use_cache=True, **last_only)
            past = res.past_key_values
            logits = res.logits[0, -1].float()
            tok = int(logits.argmax())
            out.append(tok)
            logprobs.append(float(torch.log_softmax(logits, -1)[tok]))
            step_ids = torch.tensor([[tok]])
    return out, logprobs


_HF_CACHE: dict[str, object] = {}


def _hf_model(model_dir: Path):
    import transformers

    key = str(model_dir)
    if key not in _HF_CACHE:
        auto = auto_model_class(transformers.AutoConfig.from_pretrained(model_dir))
        _HF_CACHE[key] = auto.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    return _HF_CACHE[key]


def top_k_probs(model_dir: Path, ids: list[int], k: int = 4) -> dict[int, float]:
    """The next token's distribution after `ids` under top-k sampling at temperature 1, from transformers."""
    with torch.no_grad():
        logits = _hf_model(model_dir)(torch.tensor([ids])).logits[0, -1].float()
    values, idx = logits.topk(k)
    return dict(zip(idx.tolist(), torch.softmax(values, -1).tolist()))


def first_two_token_probs(model_dir: Path, prompt: list[int], k: int = 4) -> dict[tuple[int, int], float]:
    """The exact distribution of the first two sampled tokens (top-k, temperature 1), from transformers."""
    return {(a, b): pa * pb for a, pa in top_k_probs(model_dir, prompt, k).items()
            for b, pb in top_k_probs(model_dir, prompt + [a], k).items()}


def assert_first_two_tokens_follow(outputs: list, expected: dict[tuple[int, int], float]) -> None:
    """A chi-square test at p = 0.001 that the outputs' first two tokens are drawn from `expected`."""
    n = len(outputs)
    counts = Counter(tuple(o.outputs[0].token_ids[:2]) for o in outputs)
    assert set(counts) <= set(expected)
    chi2 = sum((counts.get(k, 0) - n * p) ** 2 / (n * p) for k, p in expected.items())
    dof = len(expected) - 1
    limit = dof * (1 - 2 / (9 * dof) + 3.09 * math.sqrt(2 / (9 * dof))) ** 3  # Wilson–Hilferty: the 0.999 quantile
    assert chi2 < limit, (chi2, limit, counts)


def assert_speculation_stops_where_plain_decoding_does(plain, spec, prompts: list[str]) -> None:
    """Greedy runs of two LLMs, without and with speculation: a stop string from the second third of each plain
    text, max_tokens of 1 to 5, and logprobs must give the same text, tokens, finish and stop reasons, even when
    they fall inside a proposal."""
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    texts = [o.outputs[0].text for o in plain.generate(prompts, greedy, use_tqdm=False)]
    for p, text in zip(prompts, texts):
        if len(text) < 8:
            continue
        middle = len(text) * 2 // 3
        params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, stop=[text[middle:middle + 3]],
                                logprobs=2)
        a = plain.generate(p, params, use_tqdm=False)[0].outputs[0]
        b = spec.generate(p, params, use_tqdm=False)[0].outputs[0]
        assert (b.text, b.token_ids, b.finish_reason, b.stop_reason) == (a.text, a.token_ids, a.finish_reason,
                                                                          a.stop_reason)
        assert [sorted(d) for d in b.logprobs] == [sorted(d) for d in a.logprobs]
        for da, db in zip(a.logprobs, b.logprobs):
            for t in da:
                assert abs(db[t].logprob - da[t].logprob) <= 1e-4
    for max_tokens in (1, 2, 3, 5):
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        assert [o.outputs[0].token_ids for o in spec.generate(prompts, params, use_tqdm=False)] == \
            [o.outputs[0].token_ids for o in plain.generate(prompts, params, use_tqdm=False)]


def bytes_for_blocks(model_dir: Path, n: int, block_size: int = 16) -> int:
    """A KV budget of exactly n fp32 blocks for the checkpoint at model_dir."""
    from tally.ledger.kv import KVLayout
    from tally.models.families import read_hf_config

    cfg = read_hf_config(model_dir / "config.json")
    return n * KVLayout.for_model(cfg, kv_dtype="float32", block_size=block_size).bytes_per_block


def assert_no_block_leak(llm) -> None:
    engine = llm.engine
    pool = engine.kv.pool
    assert not engine.has_unfinished_requests()
    assert pool.num_free_blocks == pool.num_blocks, "KV blocks leaked"
    assert all(b.ref_count == 0 for b in pool.blocks)
    draft = engine.speculator.draft if engine.speculator is not None else None
    if draft is not None:  # the draft's own pool: its free blocks and the tables it still holds, each block once
        held = [b for state in draft._states.values() for b in state.blocks]
        assert len(set(held)) == len(held) and draft.pool.num_free + len(held) == draft.pool.num_blocks, \
            "draft KV blocks leaked"
