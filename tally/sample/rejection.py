"""Speculative decoding's rejection sampling (Leviathan et al. 2023; Chen et al. 2023): a token x drawn from the
draft's distribution q is kept with probability min(1, p(x) / q(x)); otherwise the token is drawn from the
residual norm(max(0, p - q)). Either way the token is distributed exactly as p, the target's distribution."""
from __future__ import annotations

import torch


def rejection_sample(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_token_ids: torch.Tensor,
                     target_samples: torch.Tensor) -> torch.Tensor:
    """[R] tokens: each row's draft token where accepted, else a draw from its residual. A row whose residual has
    no mass (p equal to q up to rounding: a rejection can then only come from rounding) keeps `target_samples`,
    the row's own draw from p."""
    index = draft_token_ids[:, None]
    p_x = target_probs.gather(1, index).squeeze(1)
    q_x = draft_probs.gather(1, index).squeeze(1)
    accept = torch.rand_like(p_x) * q_x < p_x  # u < p/q without dividing by a q that rounded to 0
    if bool(accept.all()):
        return draft_token_ids
    residual = (target_probs - draft_probs).clamp_(min=0)
    empty = residual.sum(dim=1) <= 0
    residual[empty] = target_probs[empty]  # multinomial needs mass in every row; those rows are replaced below
    resampled = torch.multinomial(residual, 1).squeeze(1)
    resampled = torch.where(empty, target_samples, resampled)
    return torch.where(accept, draft_token_ids, resampled)
