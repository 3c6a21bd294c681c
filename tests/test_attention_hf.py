"""Our sliding-window convention against transformers' own MistralAttention (eager, with the mask
transformers builds for a Mistral config), through the same projections."""
from __future__ import annotations

import pytest
import torch
from test_attention_toy import PagedKV, Seq

transformers = pytest.importorskip("transformers")
from transformers.masking_utils import create_sliding_window_causal_mask  # noqa: E402
from transformers.models.mistral.modeling_mistral import MistralAttention  # noqa: E402

from tally.attention import make_backend  # noqa: E402


@pytest.mark.parametrize("name", ["reference", "tiled"])
def test_sliding_window_matches_transformers_mistral_attention(name):
    torch.manual_seed(0)
    length, window, heads, kv_heads, head_dim = 20, 5, 4, 2, 16
    config = transformers.MistralConfig(
        hidden_size=heads * head_dim, num_attention_heads=heads, num_key_value_heads=kv_heads,
        head_dim=head_dim, sliding_window=window, attn_implementation="eager",
    )
    attn = MistralAttention(config, layer_idx=0).eval()
    hidden = torch.randn(1, length, heads * head_dim)
    # cos = 1, sin = 0 makes rotary the identity, so q/k/v are the plain projections.
    rotary = (torch.ones(1, length, head_dim), torch.zeros(1, length, head_dim))
    mask = create_sliding_window_causal_mask(
        config=config, inputs_embeds=hidden, attention_mask=None, cache=None,
        position_ids=torch.arange(length)[None],
    )
    with torch.no_grad():
        expected, _ = attn(hidden, position_embeddings=rotary, attention_mask=mask)
        x = hidden[0]
        seq = Seq(attn.q_proj(x).view(length, heads, head_dim),
                  attn.k_proj(x).view(length, kv_heads, head_dim),
                  attn.v_proj(x).view(length, kv_heads, head_dim))
        backend = make_backend(name, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                               scale=attn.scaling, sliding_window=window)
        kv = PagedKV(kv_heads, head_dim, block_size=4)
        prefill = kv.step(backend, [(seq, 0, length - 3)])[0]
        decodes = [kv.step(backend, [(seq, pos, 1)], prewrite=False)[0] for pos in range(length - 3, length)]
        ours = attn.o_proj(torch.cat([prefill, *decodes]).reshape(length, heads * head_dim))
    torch.testing.assert_close(ours, expected[0], atol=1e-5, rtol=0)
