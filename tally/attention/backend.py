"""The single place that chooses an attention implementation (the interface is interface.py)."""
from __future__ import annotations

from dataclasses import replace

import torch

from tally.attention.auto import AutoBackend
from tally.attention.interface import AttentionBackend, AttentionConfig
from tally.attention.reference import ReferenceBackend
from tally.attention.tiled import TiledBackend
from tally.errors import ConfigError

# A new backend (a GPU one, say) is a class with AttentionBackend.forward's signature, or a paged.PagedBackend that
# overrides `_prefill`; it converts the metadata to device tensors once a step (meta.memo), is listed here (imported
# lazily in make_backend if it needs triton or flashinfer), and tests/test_attention*.py run it by its name.
BACKENDS = {"auto": AutoBackend, "reference": ReferenceBackend, "tiled": TiledBackend}
BACKEND_NAMES = tuple(BACKENDS)


def make_backend(
    name: str,
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    scale: float,
    sliding_window: int | None,
    compute_dtype: torch.dtype = torch.float32,
    logit_softcap: float | None = None,
) -> AttentionBackend:
    """Build the attention backend called `name` (one of BACKEND_NAMES)."""
    if num_kv_heads <= 0 or num_heads % num_kv_heads != 0:
        raise ConfigError(
            f"num_heads ({num_heads}) must be a positive multiple of num_kv_heads ({num_kv_heads}); "
            "check num_attention_heads / num_key_value_heads in the model config"
        )
    if sliding_window is not None and sliding_window <= 0:
        raise ConfigError(
            f"sliding_window must be a positive number of tokens or None, got {sliding_window}"
        )
    config = AttentionConfig(num_heads, num_kv_heads, head_dim, scale, sliding_window, compute_dtype, logit_softcap)
    if name in BACKENDS:
        return BACKENDS[name](config)
    raise ConfigError(
        f"unknown attention backend {name!r}; choose one of: {', '.join(BACKEND_NAMES)}",
        param="attention_backend",
    )


def with_sinks(backend: AttentionBackend, sinks: torch.Tensor) -> AttentionBackend:
    """The same backend for a layer with attention sinks: its learned logit per query head [Hq]."""
    return type(backend)(replace(backend.config, sinks=tuple(sinks.float().tolist())))


def with_window(backend: AttentionBackend, sliding_window: int | None) -> AttentionBackend:
    """The same backend for layers of another window (a model whose layers alternate sliding and full)."""
    if sliding_window == backend.config.sliding_window:
        return backend
    return type(backend)(replace(backend.config, sliding_window=sliding_window))
