"""Bytes of the weights: every tensor of the model, priced at the chosen format.

Quantized formats apply to the linear layers of the decoder blocks; embeddings, the LM head, norms
and biases stay in the compute dtype (as the quantizers in the field do: the embedding is a lookup and
the head is the layer most sensitive to rounding). Scale overheads are counted, not waved away:
int8  : int8 values + one bf16 scale per output row
w8a8  : int8 values + one fp32 scale per output row (activation scales are per token, at run time)
int4  : two values per byte + bf16 scale and bf16 zero per group of `group_size` inputs (asymmetric)
gguf  : each tensor at its stored ggml type size (Q4_1 = 20 bytes per 32 values, Q6_K = 210 per 256)
stored: a `tally quantize` checkpoint: packed projections at their bytes on disk, the rest in the compute dtype
"""
from __future__ import annotations

from dataclasses import dataclass

from tally.errors import ConfigError
from tally.flags import DTYPE_ALIASES
from tally.models.config import ModelConfig

DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}
QUANT_SCHEMES = ("int8", "w8a8", "int4", "gguf", "stored")
_ROW_SCALE_BYTES = {"int8": 2, "w8a8": 4}
_GROUP_PARAM_BYTES = 2 * 2  # bf16 scale + bf16 zero per int4 group


def canonical_dtype(name: str) -> str:
    return canonical_name(name, DTYPE_ALIASES, DTYPE_BYTES, "compute dtype")


@dataclass(frozen=True)
class WeightTensor:
    name: str
    rows: int  # output features (vocab for embeddings); numel for 1-D tensors
    cols: int  # input features; 1 for 1-D tensors
    role: str  # linear | embedding | lm_head | norm | bias
    layer: int | None = None  # decoder block index; None for embedding, head, final norm
    tp_split: str | None = None  # "rows" or "cols" when tensor parallelism shards it
    kv_projection: bool = False  # k/v projections: replicated when KV heads < TP ranks
    stored_bytes: int | None = None  # as stored in a GGUF file, or packed in a quantized checkpoint

    @property
    def numel(self) -> int:
        return self.rows * self.cols


@dataclass(frozen=True)
class WeightFormat:
    scheme: str = "dense"  # dense | int8 | w8a8 | int4 | gguf
    dtype: str = "bfloat16"  # dense tensors and everything a quantized scheme leaves alone
    group_size: int = 128  # int4 inputs per (scale, zero) pair

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        if self.scheme not in ("dense", *QUANT_SCHEMES):
            raise ConfigError(f"unknown weight format {self.scheme!r}; choose one of dense, {', '.join(QUANT_SCHEMES)}")
        if self.group_size not in (32, 64, 128, 256):
            raise ConfigError(f"int4 group size must be 32, 64, 128 or 256, got {self.group_size}")

    @property
    def label(self) -> str:
        if self.scheme == "dense":
            return short_dtype(self.dtype)
        if self.scheme == "int4":
            return f"int4 g{self.group_size} (+bf16 scale & zero per group)"
        if self.scheme in _ROW_SCALE_BYTES:
            kind = "bf16" if _ROW_SCALE_BYTES[self.scheme] == 2 else "fp32"
            return f"{self.scheme} (+{kind} scale per row)"
        if self.scheme == "stored":
            return f"as stored (packed projections as quantized, the rest {short_dtype(self.dtype)})"
        return "gguf (each tensor at its stored type)"

    def tensor_bytes(self, tensor: WeightTensor) -> int:
        if self.scheme == "stored" and tensor.stored_bytes is not None:
            return tensor.stored_bytes
        if self.scheme == "gguf":
            if tensor.stored_bytes is None:
                raise ConfigError("--weights gguf needs a .gguf model file; for other models pick int8, int4 or w8a8")
            return tensor.stored_bytes
        dense = tensor.numel * DTYPE_BYTES[self.dtype]
        if self.scheme in ("dense", "stored") or tensor.role != "linear":
            return dense
        if self.scheme in _ROW_SCALE_BYTES:
            return tensor.numel + tensor.rows * _ROW_SCALE_BYTES[self.scheme]
        groups_per_row = -(-tensor.cols // self.group_size)
        return -(-tensor.numel // 2) + tensor.rows * groups_per_row * _GROUP_PARAM_BYTES


def short_dtype(dtype: str) -> str:
    """'bfloat16' -> 'bf16' for tables; names without a short form pass through."""
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(dtype, dtype)


def model_tensors(config: ModelConfig) -> list[WeightTensor]:
    """Every parameter tensor of a decoder of any family, from its shape and traits alone (every expert's)."""
    h, q, kv = config.hidden_size, config.q_size, config.kv_size
    tensors = [WeightTensor("embed_tokens", config.vocab_size, h, "embedding", tp_split="rows")]
    norms = {"pre": ("input_norm", "post_attention_norm"), "post": ("attn_output_norm", "mlp_output_norm"),
             "sandwich": ("input_norm", "post_attention_norm", "attn_output_norm", "mlp_output_norm")}
    for layer in range(config.num_layers):
        def lin(name: str, rows: int, cols: int, split: str | None, is_kv: bool = False) -> WeightTensor:
            return WeightTensor(f"layers.{layer}.{name}", rows, cols, "linear", layer, split, is_kv)

        tensors += [lin("q_proj", q, h, "rows"), lin("k_proj", kv, h, "rows", True),
                    lin("v_proj", kv, h, "rows", True), lin("o_proj", h, q, "cols")]
        tensors += [WeightTensor(f"layers.{layer}.{n}", h, 1, "norm", layer) for n in norms[config.norm_layout]]
        if config.is_moe_layer(layer):
            e = config.experts
            tensors.append(lin("router", e.num_experts, h, None))
            i = e.intermediate_size
            for x in range(e.num_experts):
                tensors += [lin(f"experts.{x}.gate_proj", i, h, "rows"), lin(f"experts.{x}.up_proj", i, h, "rows"),
                            lin(f"experts.{x}.down_proj", h, i, "cols")]
                if e.bias:
                    tensors += [WeightTensor(f"layers.{layer}.experts.{x}.{n}_bias", size, 1, "bias", layer)
                                for n, size in (("gate", i), ("up", i), ("down", h))]
            if e.bias:
                tensors.append(WeightTensor(f"layers.{layer}.router_bias", e.num_experts, 1, "bias", layer))
        else:
            i = config.intermediate_size
            tensors += [lin("gate_proj", i, h, "rows"), lin("up_proj", i, h, "rows"), lin("down_proj", h, i, "cols")]
        if config.attention_bias:
            tensors += [WeightTensor(f"layers.{layer}.q_bias", q, 1, "bias", layer, "rows"),
                        WeightTensor(f"layers.{layer}.k_bias", kv, 1, "bias", layer, "rows", True),
                        WeightTensor(f"layers.{layer}.v_bias", kv, 1, "bias", layer, "rows", True)]
        if config.attention_output_bias:
            tensors.append(WeightTensor(f"layers.{layer}.o_bias", h, 1, "bias", layer))
        if config.attention_sinks:
            tensors.append(WeightTensor(f"layers.{layer}.sinks", config.num_heads, 1, "bias", layer, "rows"))
        if config.qk_norm:
            sizes = (config.head_dim,) * 2 if config.qk_norm == "head" else (q, kv)
            tensors += [WeightTensor(f"layers.{layer}.{n}_norm", size, 1, "norm", layer)
                        for n, size in zip("qk", sizes)]
    tensors.append(WeightTensor("norm", h, 1, "norm"))
    if not config.tie_word_embeddings:
        tensors.append(WeightTensor("lm_head", config.vocab_size, h, "lm_head", tp_split="rows"))
    return tensors


def matmul_params(tensors: list[WeightTensor], config: ModelConfig) -> int:
    """Parameters that take part in a matmul per token (2 FLOPs each): linears (of the experts, the share a token
    uses) and the head, which is the embedding itself when tied. The embedding lookup costs no FLOPs."""
    total = sum(t.numel * active_share(t, config) for t in tensors if t.role in ("linear", "lm_head"))
    if config.tie_word_embeddings:
        total += sum(t.numel for t in tensors if t.role == "embedding")
    return int(total)


def active_share(tensor: WeightTensor, config: ModelConfig) -> float:
    """The share of a tensor one token reads: top_k / num_experts for an expert's (a GGUF's `*_exps` hold every
    expert's), else all of it."""
    if config.experts is None or not (".experts." in tensor.name or "_exps." in tensor.name):
        return 1.0
    return config.experts.top_k / config.experts.num_experts


def canonical_name(name: str, aliases: dict[str, str], known: dict[str, int], what: str) -> str:
    """A dtype name as the ledger spells it ('bf16' -> 'bfloat16'); unknown names say what is known."""
    key = name.strip().lower()
    key = aliases.get(key, key)
    if key not in known:
        raise ConfigError(f"unknown {what} {name!r}; choose one of {', '.join(known)}")
    return key
