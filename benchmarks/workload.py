"""Workloads shared by the engine benchmarks: request lengths sampled from the Azure conversation
trace (shipped in tally/data, CC-BY 4.0) and prompts cut from real text."""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from tally.traces import DATA_DIR, load_trace


@dataclass
class BenchRequest:
    prompt_token_ids: list[int]
    max_tokens: int


def trace_lengths(n: int, scale: int = 4, seed: int = 0, max_total: int = 2048) -> list[tuple[int, int]]:
    """n (prompt, output) lengths sampled from the trace, divided by `scale`, clipped to max_total."""
    rows = load_trace("conv").pairs()
    rng = random.Random(seed)
    out = []
    for p, o in rng.sample(rows, n):
        p, o = max(1, p // scale), max(1, o // scale)
        p = min(p, max_total - o - 1)
        out.append((p, o))
    return out


def corpus_token_ids(tokenizer, max_chars: int = 400_000) -> list[int]:
    text = (DATA_DIR / "shakespeare.txt").read_text(encoding="utf-8")[:max_chars]
    return tokenizer.encode(text, add_special_tokens=False)


def make_requests(tokenizer, lengths: list[tuple[int, int]], seed: int = 0) -> list[BenchRequest]:
    ids = corpus_token_ids(tokenizer)
    rng = random.Random(seed)
    reqs = []
    for p, o in lengths:
        start = rng.randrange(0, len(ids) - p)
        reqs.append(BenchRequest(ids[start:start + p], o))
    return reqs


def hf_model_from_gguf(path: str, dtype):
    """transformers' own GGUF loader: the peer runs the same dequantized weights we do."""
    import transformers

    p = Path(path)
    return transformers.AutoModelForCausalLM.from_pretrained(p.parent, gguf_file=p.name, dtype=dtype).eval()
