"""One sequence through the model outside the engine: a KV cache of its own, sized to the sequence.

Calibration (activation capture for `tally quantize`, key smoothing for an int8 KV cache) and tests need the
model's hidden states for a prompt without a scheduler, a block pool or a sampler."""
from __future__ import annotations

import torch

from tally.attention.metadata import AttentionMetadata
from tally.models.decoder import CausalLM


def prefill(model: CausalLM, token_ids: list[int]) -> torch.Tensor:
    """Final (normed) hidden states [T, H] of one sequence."""
    cfg, n = model.cfg, len(token_ids)
    meta = AttentionMetadata(query_start_loc=[0, n], context_lens=[n], block_tables=torch.zeros(1, 1, dtype=torch.long),
                             slot_mapping=torch.arange(n), block_size=n)
    shape = (1, n, cfg.num_kv_heads, cfg.head_dim)
    caches = [(torch.zeros(shape, dtype=model.dtype), torch.zeros(shape, dtype=model.dtype)) for _ in model.layers]
    return model(torch.tensor(token_ids), torch.arange(n), caches, meta)
