"""The shape and traits of a model, read once from a Hugging Face config.json by its family
(tally/models/families/) or from GGUF metadata (tally/models/gguf_header.py). Pure Python: the ledger plans
from it without importing torch."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Experts:
    """A mixture of experts: a router picks `top_k` of `num_experts` gated MLPs per token."""

    num_experts: int
    top_k: int
    intermediate_size: int  # each expert's
    normalize_top_k: bool  # the chosen experts' weights are rescaled to sum to one (Mixtral, Qwen3-MoE)
    dense_layers: tuple[int, ...] = ()  # layers with a dense MLP instead (Qwen3-MoE's mlp_only_layers)
    # "softmax": over every expert's logit, then the top k (Mixtral, Qwen3-MoE); "top_k_softmax": the top k logits,
    # then a softmax over those alone (GPT-OSS)
    routing: str = "softmax"
    bias: bool = False  # the router and every expert projection have biases (GPT-OSS)


@dataclass(frozen=True)
class ModelConfig:
    architecture: str  # the family's name (tally/models/families/)
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q, k, v projections (Qwen2)
    attention_output_bias: bool = False  # bias on o_proj too (GPT-OSS)
    attention_sinks: bool = False  # a learned logit per head in each softmax's denominator, with no value (GPT-OSS)
    qk_norm: str | None = None  # RMSNorm on q and k: "head" (Qwen3, Gemma 3) or "projection" (OLMo 2)
    sliding_window: int | None = None  # tokens each query may look back, itself included
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    torch_dtype: str = "float32"  # dtype the checkpoint was saved in
    # The traits below default to Llama's; a family (tally/models/families/) sets what differs.
    norm_layout: str = "pre"  # "pre" (Llama), "sandwich" (Gemma: before and after attention and MLP), "post" (OLMo 2)
    norm_scale_in_float: bool = False  # the norm's weight multiplies before the cast back (Gemma), not after
    activation: str = "silu"  # gated MLP's activation: "silu", "gelu_tanh" or "clamped_swiglu" (GPT-OSS's experts)
    # clamped_swiglu: gate clamped above at the limit, up at +-limit; (up + 1) * gate * sigmoid(alpha * gate)
    swiglu_limit: float = 7.0
    swiglu_alpha: float = 1.702
    layer_types: tuple[str, ...] = ()  # "sliding" / "full" per layer where they differ; () = all as sliding_window
    rope_theta_sliding: float | None = None  # the sliding layers' own rotary base (Gemma 3)
    nope_layers: tuple[int, ...] = ()  # layers without rotary (SmolLM3)
    partial_rotary_factor: float = 1.0  # share of each head's dimensions that rotate (Phi-4-mini)
    attn_logit_softcap: float | None = None  # scores = cap * tanh(scores / cap) (Gemma 2)
    final_logit_softcap: float | None = None
    query_scale: float | None = None  # attention's score scale; None: head_dim ** -0.5
    embedding_multiplier: float = 1.0  # Gemma: sqrt(hidden); Granite: its embedding_multiplier
    residual_multiplier: float = 1.0  # Granite: each block's output is scaled before the residual add
    logits_scaling: float = 1.0  # Granite: logits are divided by it
    experts: Experts | None = None  # a mixture of experts in place of the dense MLP

    @property
    def layer_window(self) -> tuple[int | None, ...]:
        """Each layer's sliding window (None: full attention)."""
        if not self.layer_types:
            return (self.sliding_window,) * self.num_layers
        return tuple(self.sliding_window if kind == "sliding" else None for kind in self.layer_types)

    @property
    def uniform_sliding_window(self) -> int | None:
        """The window when every layer slides: only then may the KV cache drop what falls out of it."""
        windows = set(self.layer_window)
        return windows.pop() if len(windows) == 1 else None

    @property
    def attention_scale(self) -> float:
        return self.head_dim ** -0.5 if self.query_scale is None else self.query_scale

    def is_moe_layer(self, layer: int) -> bool:
        return self.experts is not None and layer not in self.experts.dense_layers

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def num_parameters(self) -> int:
        """Parameter count from the shape alone (what the ledger plans with); every expert counts."""
        h, layers = self.hidden_size, self.num_layers
        attn = h * self.q_size + 2 * h * self.kv_size + self.q_size * h
        if self.attention_bias:
            attn += self.q_size + 2 * self.kv_size
        attn += h * self.attention_output_bias + self.num_heads * self.attention_sinks
        if self.qk_norm:
            attn += 2 * self.head_dim if self.qk_norm == "head" else self.q_size + self.kv_size
        norms = {"pre": 2, "sandwich": 4, "post": 2}[self.norm_layout] * h
        mlps = sum(self.mlp_parameters(layer) for layer in range(layers))
        embed = self.vocab_size * h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return layers * (attn + norms) + mlps + embed + head + h

    def mlp_parameters(self, layer: int, active_only: bool = False) -> int:
        """One layer's MLP (its router and experts: those a token uses when `active_only`)."""
        h = self.hidden_size
        if not self.is_moe_layer(layer):
            return 3 * h * self.intermediate_size
        e = self.experts
        count = e.top_k if active_only else e.num_experts
        expert = 3 * h * e.intermediate_size + (2 * e.intermediate_size + h) * e.bias
        return (h + e.bias) * e.num_experts + count * expert
