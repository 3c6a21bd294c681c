"""The suites that ship in tally/quality/data/, turned into token ids for one tokenizer and context length.

Prompts are built once, from the baseline's tokenizer, and the very same ids go to the candidate: the gate
compares models, never two tokenizations of a prompt.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tally.models.chat_template import chat_prompt, join_turns
from tally.traces import json_lines

if TYPE_CHECKING:
    from tally.models.tokenizer import Tokenizer

DATA = Path(__file__).parent / "data"
HELDOUT = {"python_docs": "eval_python_docs.txt", "shakespeare": "eval_shakespeare.txt"}
TASK_SUITES = {"json": "tasks_json.jsonl", "numbers": "tasks_numbers.jsonl", "format": "tasks_format.jsonl"}
LONGTAIL = "longtail.jsonl"
FILL_MARGIN_TOKENS = 8  # re-encoding a decoded cut can shift a few tokens; keep clear of the limit


@dataclass
class Item:
    suite: str  # json | numbers | format | longtail
    id: str
    prompt_token_ids: list[int]
    check: dict[str, Any] | None = None  # task items: what a correct answer looks like
    category: str | None = None  # long-tail items: long | languages | noisy | tables


@dataclass
class Workload:
    ppl_windows: dict[str, list[list[int]]]  # held-out text name -> windows of token ids
    items: list[Item]
    skipped: list[str]  # item ids whose prompt + max_tokens does not fit max_model_len


def heldout_text(name: str) -> str:
    return (DATA / HELDOUT[name]).read_text()


def read_jsonl(name: str, limit: int | None = None) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in json_lines((DATA / name).read_text(encoding="utf-8"))]
    return rows[:limit]


def tokenize_heldout(tokenizer: Tokenizer) -> dict[str, list[int]]:
    # verbose=False: the texts are far longer than model_max_length on purpose; no warning wanted.
    return {name: tokenizer.encode(heldout_text(name), add_special_tokens=False, verbose=False) for name in HELDOUT}


def ppl_windows(heldout_ids: dict[str, list[int]], ppl_tokens: int, window_tokens: int) -> dict[str, list[list[int]]]:
    """ppl_tokens split evenly over the held-out texts; each text's share is cut into windows spread evenly
    across the whole text, so the score is not just the first page."""
    per_text = max(2, ppl_tokens // len(heldout_ids))
    out = {}
    for name, ids in heldout_ids.items():
        # Each window scores window - 1 tokens (the first has nothing before it).
        n_windows = max(1, -(-per_text // (window_tokens - 1)))
        size = min(window_tokens, per_text // n_windows + 1, len(ids))
        stride = (len(ids) - size) // max(1, n_windows - 1) if n_windows > 1 else 0
        out[name] = [ids[i * stride:i * stride + size] for i in range(n_windows)]
    return out


def chat_ids(tokenizer: Tokenizer, messages: list[dict[str, str]]) -> list[int]:
    # A model without a template (a base model) is still evaluated: its turns as paragraphs.
    return chat_prompt(tokenizer, messages, without_template=join_turns("\n\n", "\n\n"))["prompt_token_ids"]


def fill_ids(tokenizer: Tokenizer, row: dict[str, Any], source: list[int], budget_tokens: int) -> list[int]:
    """A long-tail prompt whose {filler} is held-out text cut so the whole prompt is close to budget_tokens."""
    def build(filler: str) -> list[int]:
        messages = [{**m, "content": m["content"].replace("{filler}", filler)} for m in row["messages"]]
        return chat_ids(tokenizer, messages)

    room = budget_tokens - len(build("")) - FILL_MARGIN_TOKENS
    ids = build(tokenizer.decode(source[:max(0, room)]))
    while len(ids) > budget_tokens and room > 0:
        room -= FILL_MARGIN_TOKENS
        ids = build(tokenizer.decode(source[:room]))
    return ids


def build_workload(tokenizer: Tokenizer, max_model_len: int, suites: tuple[str, ...], ppl_tokens: int,
                   window_tokens: int, max_tokens: int, limit: int | None) -> Workload:
    heldout_ids = tokenize_heldout(tokenizer)
    windows = ppl_windows(heldout_ids, ppl_tokens, min(window_tokens, max_model_len)) if "ppl" in suites else {}
    budget = max_model_len - max_tokens
    items, skipped = [], []
    rows: list[tuple[str, dict[str, Any]]] = []
    if "tasks" in suites:
        rows += [(suite, r) for suite, file in TASK_SUITES.items() for r in read_jsonl(file, limit)]
    if "longtail" in suites:
        rows += [("longtail", r) for r in read_jsonl(LONGTAIL, limit)]
    for suite, row in rows:
        if row.get("fill"):
            ids = fill_ids(tokenizer, row, heldout_ids[row["fill"]], budget)
        else:
            ids = chat_ids(tokenizer, row["messages"])
        if len(ids) > budget or len(ids) < 1:
            skipped.append(row["id"])
            continue
        items.append(Item(suite, row["id"], ids, row.get("check"), row.get("category")))
    return Workload(windows, items, skipped)
