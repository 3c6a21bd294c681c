"""Logit edits a request asks for by token: OpenAI's `logit_bias` (added to the named tokens' logits, clamped
to ±100 as OpenAI does) and vLLM's `allowed_token_ids` (every other token masked out), built once per batch
composition with the rest of SamplingTensors and applied in place, one scatter and one masked_fill per step; and
vLLM's `bad_words`, which depend on the output so far."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tally.sampling_params import SamplingParams

MAX_BIAS = 100.0


@dataclass
class TokenEditTensors:
    bias_rows: torch.Tensor | None  # [N] batch row of each biased (row, token)
    bias_cols: torch.Tensor | None  # [N] its token id
    bias_values: torch.Tensor | None  # [N]
    allowed_rows: torch.Tensor | None  # [A] rows with allowed_token_ids
    allowed: torch.Tensor | None  # bool [A, V]: the tokens each of them may sample

    @classmethod
    def build(cls, params: list[SamplingParams], vocab_size: int, device: torch.device) -> TokenEditTensors | None:
        biased = [(i, int(t), max(-MAX_BIAS, min(MAX_BIAS, b))) for i, p in enumerate(params)
                  for t, b in (p.logit_bias or {}).items()]
        limited = [i for i, p in enumerate(params) if p.allowed_token_ids]
        if not biased and not limited:
            return None
        allowed = None
        if limited:
            allowed = torch.zeros(len(limited), vocab_size, dtype=torch.bool, device=device)
            for j, i in enumerate(limited):
                allowed[j, torch.tensor(params[i].allowed_token_ids, device=device)] = True
        rows, cols, values = zip(*biased) if biased else ((), (), ())
        return cls(
            bias_rows=torch.tensor(rows, dtype=torch.long, device=device) if biased else None,
            bias_cols=torch.tensor(cols, dtype=torch.long, device=device) if biased else None,
            bias_values=torch.tensor(values, dtype=torch.float32, device=device) if biased else None,
            allowed_rows=torch.tensor(limited, dtype=torch.long, device=device) if limited else None,
            allowed=allowed,
        )


def apply_bad_words(logits: torch.Tensor, bad_words: list[tuple[tuple[int, ...], ...]],
                    output_token_ids: list[list[int]]) -> None:
    """vLLM's rule: a bad word's last token is banned when the output so far ends with the tokens before it (a
    one-token word: always). One Python pass over the rows' words; the bans go in with one index_put."""
    rows, cols = [], []
    for row, (words, output) in enumerate(zip(bad_words, output_token_ids)):
        for word in words:
            prefix = word[:-1]
            if not prefix or tuple(output[len(output) - len(prefix):]) == prefix:
                rows.append(row)
                cols.append(word[-1])
    if rows:
        logits.index_put_((torch.tensor(rows, device=logits.device), torch.tensor(cols, device=logits.device)),
                          torch.tensor(float("-inf"), device=logits.device))


def apply_token_edits(logits: torch.Tensor, t: TokenEditTensors) -> None:
    if t.allowed is not None:
        rows = logits.index_select(0, t.allowed_rows).masked_fill_(~t.allowed, float("-inf"))
        logits.index_copy_(0, t.allowed_rows, rows)
    if t.bias_rows is not None:
        logits.index_put_((t.bias_rows, t.bias_cols), t.bias_values, accumulate=True)
