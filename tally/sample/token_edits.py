"""Logit edits fixed for a request's whole life: OpenAI's `logit_bias` (added to the named tokens' logits, clamped
to ±100 as OpenAI does) and vLLM's `allowed_token_ids` (every other token masked out). Built once per batch
composition with the rest of SamplingTensors; applied in place, one scatter and one masked_fill per step."""
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


def apply_token_edits(logits: torch.Tensor, t: TokenEditTensors) -> None:
    if t.allowed is not None:
        rows = logits.index_select(0, t.allowed_rows).masked_fill_(~t.allowed, float("-inf"))
        logits.index_copy_(0, t.allowed_rows, rows)
    if t.bias_rows is not None:
        logits.index_put_((t.bias_rows, t.bias_cols), t.bias_values, accumulate=True)
