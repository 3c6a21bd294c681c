"""Bytes of the KV cache: the one place that says how big a token, a block and a pool are.

The engine sizes its KV pool with `KVLayout.num_blocks_for_budget`, `tally plan` reports the same
numbers, so what is planned is what is allocated. A block holds `block_size` token slots of K and V
for every layer. Quantized KV stores float32 scales next to the values: int8 one per (layer, K/V, token, KV head),
fp8 one per (layer, K/V, block, KV head), so bytes per block are exact and bytes per token amortized.
"""
from __future__ import annotations

from dataclasses import dataclass

from tally.errors import ConfigError
from tally.flags import KV_CACHE_DTYPE_ALIASES
from tally.ledger.weights import canonical_name
from tally.models.config import ModelConfig

KV_DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1, "fp8": 1}
SCALED_KV_DTYPES = frozenset({"int8", "fp8"})
SCALE_BYTES = 4  # a float32 scale
# the CPU engine's int8 cache scales each token on its own, so its bits never depend on its neighbours
# (tally/attention/kv_cache.py); fp8 (planned for GPU devices) one scale per block
PER_TOKEN_SCALES = frozenset({"int8"})


def canonical_kv_dtype(name: str) -> str:
    return canonical_name(name, KV_CACHE_DTYPE_ALIASES, KV_DTYPE_BYTES, "KV cache dtype")


def auto_kv_dtype(compute_dtype: str, quantized: bool) -> str:
    """What `--kv-cache-dtype auto` stores: the compute dtype, which keeps dense weights' greedy tokens exactly
    transformers'; but float16 where quantized weights are computed in fp32 (a GGUF's blocks as stored). Their
    arithmetic is not the oracle's anyway (activations rounded to int8 per block), llama.cpp and vLLM keep 16-bit
    caches for such models, and half the bytes hold twice the tokens and speed long decodes at no measurable cost in
    perplexity (docs/benchmarks.md#kv-cache)."""
    return "float16" if quantized and compute_dtype == "float32" else compute_dtype


@dataclass(frozen=True)
class KVLayout:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    kv_dtype: str = "bfloat16"
    block_size: int = 16  # token slots per block

    def __post_init__(self) -> None:
        object.__setattr__(self, "kv_dtype", canonical_kv_dtype(self.kv_dtype))
        for name in ("num_layers", "num_kv_heads", "head_dim", "block_size"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"KV layout needs {name} >= 1, got {getattr(self, name)}")

    @property
    def value_bytes_per_token(self) -> int:
        """K and V values of one token across all layers: 2 x layers x KV heads x head dim x bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * KV_DTYPE_BYTES[self.kv_dtype]

    @property
    def scale_bytes_per_block(self) -> int:
        if self.kv_dtype not in SCALED_KV_DTYPES:
            return 0
        per_block = self.block_size if self.kv_dtype in PER_TOKEN_SCALES else 1
        return 2 * self.num_layers * self.num_kv_heads * SCALE_BYTES * per_block

    @property
    def bytes_per_block(self) -> int:
        """Exact bytes of one block: values of block_size tokens plus the block's scales."""
        return self.block_size * self.value_bytes_per_token + self.scale_bytes_per_block

    @property
    def bytes_per_token(self) -> int:
        """Values plus the block's scales shared out over its slots (rounded up to a whole byte)."""
        return -(-self.bytes_per_block // self.block_size)

    def blocks_for_tokens(self, num_tokens: int) -> int:
        return -(-max(num_tokens, 0) // self.block_size)

    def bytes_for_tokens(self, num_tokens: int) -> int:
        """KV bytes one request of `num_tokens` holds, in whole blocks (what the allocator hands out)."""
        return self.blocks_for_tokens(num_tokens) * self.bytes_per_block

    def num_blocks_for_budget(self, budget_bytes: int) -> int:
        return max(int(budget_bytes), 0) // self.bytes_per_block

    @classmethod
    def for_model(cls, config: ModelConfig, *, kv_dtype: str = "bfloat16", block_size: int = 16,
                  tp_size: int = 1, pp_size: int = 1) -> "KVLayout":
        """The layout one device holds: KV heads split over TP ranks (replicated when there are fewer
        heads than ranks), layers split over pipeline stages (the largest stage)."""
        return cls(
            num_layers=-(-config.num_layers // pp_size),
            num_kv_heads=-(-config.num_kv_heads // tp_size),
            head_dim=config.head_dim,
            kv_dtype=kv_dtype,
            block_size=block_size,
        )
