"""Key smoothing for the int8 KV cache: flatten the outlier channels of K before it is quantized.

Some models' keys carry a few channels far larger than the rest (Qwen2.5's k_proj bias, for one); with one int8
scale per (token, KV head) those channels set the scale and the others keep a few levels. Attention only needs
q·k, and (q·s)·(k/s) = q·k for any per-channel s, so each layer stores k/s and multiplies q by s: the scores are
unchanged and the cache holds a flatter K. s must be equal on the two channels RoPE rotates together (i and
i + D/2), so the rotation commutes with it; it is measured once at start-up, from one prefill of shipped text
(disjoint from the evaluation text), as SmoothQuant does for activations: s = max|k|^α normalised to geometric
mean 1 per head, α = 0.5. Costs: one prefill at load, two multiplies per layer per step, D floats per KV head.
"""
from __future__ import annotations

from pathlib import Path

import torch

from tally.models.decoder import CausalLM
from tally.models.prefill import prefill

ALPHA = 0.5
CALIBRATION_TOKENS = 256
_TEXT = Path(__file__).parents[1] / "data" / "shakespeare.txt"  # not in tally eval's held-out text
_MIN = 1e-5


def calibration_ids(tokenizer) -> list[int]:
    text = _TEXT.read_text()[:20_000]
    return tokenizer.encode(text, add_special_tokens=False)[:CALIBRATION_TOKENS]


@torch.inference_mode()
def measure_key_scales(model: CausalLM, token_ids: list[int], alpha: float = ALPHA) -> list[torch.Tensor]:
    """Per layer, s [Hkv, D]: equal on each RoPE pair, geometric mean 1 per head."""
    cfg = model.cfg
    k_start, k_end = cfg.q_size, cfg.q_size + cfg.kv_size
    maxima: list[torch.Tensor | None] = [None] * len(model.layers)
    handles = []
    for i, layer in enumerate(model.layers):
        def record(_module, _args, out, i=i, layer=layer):
            k = out[:, k_start:k_end].float()
            if cfg.qk_norm == "projection":
                k = layer.k_norm(k) if layer.whole_heads is None else layer.projection_norms(out.float())[1]
            k = k.view(-1, cfg.num_kv_heads, cfg.head_dim)
            if cfg.qk_norm == "head":
                k = layer.k_norm(k)
            maxima[i] = k.abs().amax(0)
        handles.append(layer.qkv_proj.register_forward_hook(record))
    try:
        prefill(model, token_ids[:cfg.max_position_embeddings])  # the rotary table stops at max_model_len
    finally:
        for h in handles:
            h.remove()
    rotated = int(cfg.head_dim * cfg.partial_rotary_factor)
    half = rotated // 2
    scales = []
    for m in maxima:
        m = m.clone()
        m[:, :half] = m[:, half:rotated] = torch.maximum(m[:, :half], m[:, half:rotated])  # RoPE mixes i, i + d/2
        s = m.clamp(min=_MIN).pow(alpha)
        scales.append((s / s.log().mean(-1, keepdim=True).exp()).to(model.dtype))
    return scales
