"""Which kernel serves how many tokens: the row count from which each layer kind leaves its few-token kernel.

PLACEHOLDER values until bench/quant_kernels.py has been run on this machine.
"""
from __future__ import annotations

import torch

NEVER = 1 << 62  # a threshold no batch reaches: the few-token kernel serves every batch size

_MANY_TOKENS_FROM: dict[tuple[str, torch.dtype], int] = {
    ("int8", torch.bfloat16): 16,
    ("int4", torch.bfloat16): 16,
    ("w8a8", torch.bfloat16): 8,
    ("q8_0", torch.bfloat16): 8,
    ("int8", torch.float32): 1,
    ("int4", torch.float32): 1,
    ("w8a8", torch.float32): 1,
    ("q8_0", torch.float32): 1,
}


def many_tokens_from(kind: str, compute_dtype: torch.dtype) -> int:
    """Unmeasured dtypes (fp16) get the dense path always: the CPU weight-only kernels are not fast there."""
    return _MANY_TOKENS_FROM.get((kind, compute_dtype), 1)
