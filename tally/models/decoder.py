"""The decoder every family runs (tally/models/families/) over a flat varlen batch and a paged KV cache.

Llama's layer is the base; a family's traits (ModelConfig) change where the norms sit, the q/k norms, the
activation, the rotary per layer, the attention's window, scale and soft-capping, the multipliers and whether the
MLP is a mixture of experts. Q, K and V are one fused projection and gate/up another, so a dense layer is five
matmuls. In fp32 the native fused paths run every trait tally/models/native_traits.py lists."""
from __future__ import annotations

from functools import cache
from itertools import islice
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from tally.attention.backend import with_sinks, with_window
from tally.attention.interface import AttentionBackend
from tally.attention.kv_cache import Int8KVCache, KVCache
from tally.attention.metadata import AttentionMetadata
from tally.layers.lora import LoRASlots
from tally.layers.norm import RMSNorm
from tally.layers.parallel import TPGroup, WholeHeads
from tally.layers.rotary import RotaryEmbedding
from tally.models.config import ModelConfig
from tally.models.experts import MixtureOfExperts
from tally.models.native_decode_step import NativeDecodeStep
from tally.models.native_traits import layer_unsupported
from tally.models.pipeline_split import PPStage
from tally.models.tensor_map import Reader, TensorMap
from tally.native import ops as native

# (names of the HF tensors fused, bias?) → one module
ProjectionFactory = Callable[[list[str], bool], nn.Module]
# (the head weight's reader [V, H], tied to the embedding?) -> the LM head module
HeadFactory = Callable[[Reader, bool], nn.Module]
# a module whose `embedding_rows` serve the lookup from the checkpoint's stored blocks, or None
EmbeddingFactory = Callable[[], nn.Module | None]
Rope = tuple[torch.Tensor, torch.Tensor]


def _converted(read: Reader, dtype: torch.dtype) -> Reader:
    return cache(lambda: read().to(dtype))


def gated_activation(cfg: ModelConfig) -> Callable[[torch.Tensor], torch.Tensor]:
    """[T, 2I] gate and up side by side -> act(gate) * up [T, I]; GPT-OSS's clamped SwiGLU as transformers computes
    it."""
    if cfg.activation == "clamped_swiglu":
        limit, alpha = cfg.swiglu_limit, cfg.swiglu_alpha

        def clamped(gate_up: torch.Tensor) -> torch.Tensor:
            gate, up = gate_up.chunk(2, dim=-1)
            gate, up = gate.clamp(max=limit), up.clamp(min=-limit, max=limit)
            return (up + 1) * (gate * torch.sigmoid(gate * alpha))
        return clamped
    act = F.silu if cfg.activation == "silu" else lambda x: F.gelu(x, approximate="tanh")

    def gated(gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return act(gate) * up
    return gated


class DecoderLayer(nn.Module):
    """`rotary`: the table this layer rotates q and k with, None for a layer without rotary (NoPE)."""

    def __init__(self, cfg: ModelConfig, index: int, tensors: dict[str, torch.Tensor], make_proj: ProjectionFactory,
                 attn: AttentionBackend, rotary: RotaryEmbedding | None, dtype: torch.dtype,
                 tp: TPGroup | None = None, whole_heads: WholeHeads | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.whole_heads = whole_heads  # under TP, q/k norms over the whole projection see every rank's heads
        prefix = f"model.layers.{index}"
        a, m = f"{prefix}.self_attn", f"{prefix}.mlp"
        self.qkv_proj = make_proj([f"{a}.q_proj", f"{a}.k_proj", f"{a}.v_proj"], cfg.attention_bias)
        self.o_proj = make_proj([f"{a}.o_proj"], cfg.attention_output_bias)
        self.activation = gated_activation(cfg)
        self.experts = None
        if cfg.is_moe_layer(index):
            self.experts = MixtureOfExperts(cfg, m, tensors, make_proj, self.activation, dtype, tp)
        else:
            self.gate_up_proj = make_proj([f"{m}.gate_proj", f"{m}.up_proj"], False)
            self.down_proj = make_proj([f"{m}.down_proj"], False)

        def norm(name: str, wanted: bool = True) -> RMSNorm | None:
            if not wanted:
                return None
            return RMSNorm(tensors.pop(f"{name}.weight"), cfg.rms_norm_eps, dtype, cfg.norm_scale_in_float)
        pre, post = cfg.norm_layout in ("pre", "sandwich"), cfg.norm_layout in ("post", "sandwich")
        self.input_norm = norm(f"{prefix}.input_layernorm", pre)
        self.post_attn_norm = norm(f"{prefix}.post_attention_layernorm", pre)  # before the MLP, as Llama names it
        self.attn_output_norm = norm(f"{prefix}.attn_output_norm", post)
        self.mlp_output_norm = norm(f"{prefix}.mlp_output_norm", post)
        self.q_norm = norm(f"{a}.q_norm", bool(cfg.qk_norm))
        self.k_norm = norm(f"{a}.k_norm", bool(cfg.qk_norm))
        self.attn = with_sinks(attn, tensors.pop(f"{a}.sinks")) if cfg.attention_sinks else attn
        self.rotary = rotary
        # fp32 and traits the native fused steps compute (tally/native; the cache is checked per call)
        self.native = (not layer_unsupported(cfg) and dtype == torch.float32 and native.available()
                       and native.vector_supported(cfg.head_dim) and native.vector_supported(cfg.hidden_size))
        # int8 KV only (tally/models/key_smoothing.py): the cache holds k / s and q is multiplied by s.
        self.key_scale: torch.Tensor | None = None  # [Hkv, D] reciprocal of s, applied to k
        self.query_scale: torch.Tensor | None = None  # [Hq, D] s of each query head's KV head, applied to q

    def forward(self, h: torch.Tensor, ropes: dict[int, Rope], kv_cache: tuple[KVCache, KVCache],
                meta: AttentionMetadata) -> torch.Tensor:
        """`ropes`: this step's cos and sin of each rotary table, by id()."""
        rope = ropes[id(self.rotary)] if self.rotary is not None else None
        k_cache = kv_cache[0]
        if self.native and (isinstance(k_cache, Int8KVCache)
                            or self.key_scale is None and k_cache.dtype in native.KV_KINDS):
            return self._forward_native(h, rope, kv_cache, meta)
        a = self._attention(self.input_norm(h) if self.input_norm is not None else h, rope, kv_cache, meta)
        h = self._add(h, self.attn_output_norm(a) if self.attn_output_norm is not None else a)
        x = self.post_attn_norm(h) if self.post_attn_norm is not None else h
        mlp = self.experts(x) if self.experts is not None else self.down_proj(self.activation(self.gate_up_proj(x)))
        return self._add(h, self.mlp_output_norm(mlp) if self.mlp_output_norm is not None else mlp)

    def _add(self, residual: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
        multiplier = self.cfg.residual_multiplier
        return residual + (block if multiplier == 1.0 else block * multiplier)

    def _attention(self, x: torch.Tensor, rope: Rope | None, kv_cache: tuple[KVCache, KVCache],
                   meta: AttentionMetadata) -> torch.Tensor:
        cfg = self.cfg
        t = x.shape[0]
        qkv = self.qkv_proj(x)
        k_end = cfg.q_size + cfg.kv_size
        heads = cfg.num_heads + cfg.num_kv_heads
        if cfg.qk_norm == "projection":  # one norm over all heads' q, another over k (OLMo 2)
            qk = torch.cat(self.projection_norms(qkv), dim=1).view(t, heads, cfg.head_dim)
        else:
            qk = qkv[:, :k_end].view(t, heads, cfg.head_dim)
        v = qkv[:, k_end:].view(t, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm == "head":  # per-head norms with their own weights, before the rotation
            q, k = qk.split([cfg.num_heads, cfg.num_kv_heads], dim=1)
            qk = torch.cat([self.q_norm(q), self.k_norm(k)], dim=1)
        # q and k rotate as one tensor (one set of ops per layer, not two), then split as views.
        if rope is not None:
            qk = self.rotary.rotate(qk, rope)
        q, k = qk.split([cfg.num_heads, cfg.num_kv_heads], dim=1)
        if self.key_scale is not None:
            q, k = q * self.query_scale, k * self.key_scale
        o = self.attn.forward(q, k, v, kv_cache[0], kv_cache[1], meta)
        return self.o_proj(o.reshape(t, cfg.q_size))

    def projection_norms(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's q and k of qkv [T, q + 2 kv], normed over the whole q and k projections (OLMo 2). Under
        tensor parallelism the norms run over every rank's heads, gathered, as one process runs them (the native
        layer's contiguous rows, the PyTorch layer's column slices), so the values are one process's bits."""
        q, k = qkv[:, :self.cfg.q_size], qkv[:, self.cfg.q_size:self.cfg.q_size + self.cfg.kv_size]
        if self.whole_heads is None:
            return self.q_norm(q), self.k_norm(k)
        whole = self.whole_heads.gather(q, k)
        q, k = whole[:, :self.whole_heads.q_size], whole[:, self.whole_heads.q_size:]
        if self.native:
            q, k = q.contiguous(), k.contiguous()
        return self.whole_heads.own(torch.cat([self.q_norm(q), self.k_norm(k)], dim=1))

    def _forward_native(self, h: torch.Tensor, rope: Rope | None, kv_cache: tuple[KVCache, KVCache],
                        meta: AttentionMetadata) -> torch.Tensor:
        """The same layer with its small steps fused into native calls: q/k norms, rotary and the cache write in one
        pass over qkv, the gated activation in one; attention is the backend's. A decode step's layer is ~10 calls
        instead of ~40."""
        cfg = self.cfg
        t = h.shape[0]
        qkv = self.qkv_proj(self.input_norm(h) if self.input_norm is not None else h)
        cos, sin = (None, None) if rope is None else rope
        norms = (None, None) if self.q_norm is None else (self.q_norm.weight, self.k_norm.weight)
        if self.whole_heads is not None:  # normed here over every rank's heads, then rotated and stored as usual
            qkv[:, :cfg.q_size + cfg.kv_size] = torch.cat(self.projection_norms(qkv), dim=1)
            norms = (None, None)
        k_cache, v_cache = kv_cache
        int8 = None
        if isinstance(k_cache, Int8KVCache):  # the one-call decode step's write, so mixed steps give its bits
            int8 = native.Int8Store(k_cache.scales, v_cache.scales, self.query_scale, self.key_scale)
            k_cache, v_cache = k_cache.values, v_cache.values
        native.rope_store(qkv, cos, sin, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, k_cache, v_cache,
                          meta.slot_mapping, *norms, cfg.qk_norm == "projection", cfg.rms_norm_eps, int8)
        o = self.attn.attend(qkv[:, :cfg.q_size].view(t, cfg.num_heads, cfg.head_dim), *kv_cache, meta)
        h = self._add_block(h, self.o_proj, o.reshape(t, cfg.q_size), self.attn_output_norm)
        x = self.post_attn_norm(h) if self.post_attn_norm is not None else h
        if self.experts is not None:
            mlp = self.experts(x)
            return self._add(h, self.mlp_output_norm(mlp) if self.mlp_output_norm is not None else mlp)
        gate_up = self.gate_up_proj(x)
        act = native.gated_mul(gate_up, cfg.activation, cfg.swiglu_alpha, cfg.swiglu_limit)
        return self._add_block(h, self.down_proj, act, self.mlp_output_norm)

    def _add_block(self, h: torch.Tensor, proj: nn.Module, x: torch.Tensor, norm: nn.Module | None) -> torch.Tensor:
        """h + norm(proj(x)), as _add. Where nothing comes between the projection and the add, h itself takes the
        sum (the layer's input is its own: CausalLM.forward), and a projection with `add_to` adds as its kernel
        stores, as the one-call decode step's add_block does: the same bits, without a pass over the residual.
        Hooks that watch the projection's calls (calibration) see a plain call."""
        if norm is not None or self.cfg.residual_multiplier != 1.0:
            a = proj(x)
            return self._add(h, norm(a) if norm is not None else a)
        add_to = getattr(proj, "add_to", None)
        if add_to is None or proj._forward_pre_hooks or proj._forward_hooks:
            return h.add_(proj(x))
        return add_to(x, h)


class CausalLM(nn.Module):
    """A decoder-only model of any family.

    `weight_dtype=torch.float16` (with fp32 `dtype`): the embedding and the LM head are stored in fp16 too. A tied
    head whose module can return rows of its weight (`embedding_rows`: native fp16 panels, native int8) also
    serves the lookup, so the table is held once; otherwise `make_embedding` may hold it as the checkpoint stores it
    (a GGUF's blocks: Qwen2.5-0.5B's Q5_0 table is 102 MB held so, 544 MB as an fp32 tensor), else (FBGEMM's packed
    layout, dense) the embedding is a separate tensor.

    Under tensor parallelism (`tp`) `cfg` is this rank's slice (tally/models/tensor_parallel.py), the factories
    make row-parallel and vocabulary-parallel modules, and the embedding holds vocabulary rows [*vocab).
    Under pipeline parallelism (`stage`) it holds that stage's layers only: the embedding on the first stage, the
    final norm and the head on the last (tally/models/pipeline_split.py)."""

    def __init__(self, cfg: ModelConfig, tensors: TensorMap, make_proj: ProjectionFactory,
                 make_head: HeadFactory, attn: AttentionBackend, dtype: torch.dtype,
                 weight_dtype: torch.dtype | None = None, tp: TPGroup | None = None, vocab: tuple[int, int] = (0, 0),
                 stage: PPStage | None = None, make_embedding: EmbeddingFactory | None = None,
                 whole_heads: WholeHeads | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.dtype = dtype
        self.tp = tp
        self.vocab_start, self.vocab_rows = vocab[0], vocab[1] - vocab[0]
        first, last = stage is None or stage.first, stage is None or stage.last
        head = tensors.take("lm_head.weight") if last and "lm_head.weight" in tensors else None
        tied = last and (cfg.tie_word_embeddings or head is None)
        # read only where neither the head nor the stored blocks serve the lookup
        embed = _converted(tensors.take("model.embed_tokens.weight"), weight_dtype or dtype) if first or tied else None
        self.embed_tokens: nn.Parameter | None = None
        rotary_dim = int(cfg.head_dim * cfg.partial_rotary_factor)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta,
                                      cfg.rope_scaling, dtype, rotary_dim)
        # Gemma 3's sliding layers rotate with a base of their own, unscaled
        sliding_rotary = self.rotary if cfg.rope_theta_sliding is None else RotaryEmbedding(
            cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta_sliding, None, dtype, rotary_dim)
        self.rotaries = nn.ModuleList(dict.fromkeys([self.rotary, sliding_rotary]))
        windows = cfg.layer_window
        layers = range(*stage.layers) if stage is not None else range(cfg.num_layers)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, i, tensors, make_proj, with_window(attn, windows[i]),
                         None if i in cfg.nope_layers else sliding_rotary if windows[i] else self.rotary, dtype, tp,
                         whole_heads)
            for i in layers
        )
        self.norm = (RMSNorm(tensors.pop("model.norm.weight"), cfg.rms_norm_eps, dtype, cfg.norm_scale_in_float)
                     if last else None)
        self.lm_head = make_head(embed if tied else head, tied) if last else None
        self.embed_blocks = None  # the stored blocks serving the lookup, when neither a table nor the head does
        head_serves = tied and getattr(self.lm_head, "embedding_rows", None) is not None  # one copy of the table
        if first and not head_serves:
            self.embed_blocks = make_embedding() if make_embedding is not None else None
            if self.embed_blocks is None:
                self.embed_tokens = nn.Parameter(embed(), requires_grad=False)
        # every layer's decode step in one native call, where the model's formats allow (built after loading)
        self.native_step: NativeDecodeStep | None = None
        self.lora: LoRASlots | None = None  # LoRA adapters' per-row deltas (tally/engine/lora_manager.py installs it)
        self.huge_page_bytes = 0  # the weights' bytes moved onto huge pages (tally/layers/huge_pages.py), after loading

    def set_key_smoothing(self, scales: list[torch.Tensor] | None) -> None:
        """Per layer s [Hkv, D] (None: off). Only while the KV cache is empty: it changes what the cache holds."""
        group = self.cfg.num_heads // self.cfg.num_kv_heads
        for layer, s in zip(self.layers, scales or [None] * len(self.layers)):
            layer.key_scale = None if s is None else (1.0 / s).to(self.dtype)
            layer.query_scale = None if s is None else s.repeat_interleave(group, dim=0).to(self.dtype)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[tuple[KVCache, KVCache]], meta: AttentionMetadata,
                hidden: torch.Tensor | None = None) -> torch.Tensor:
        """`hidden`: the previous pipeline stage's output [T, H], which this stage's layers continue from instead of
        the embedding. Returns the normed final hidden state, or on a stage before the last its layers' output."""
        # the layers' own: native layers add their blocks into it in place (DecoderLayer._add_block)
        h = self.embed(input_ids) if hidden is None else hidden.clone()
        if self._native_step_runs(meta, kv_caches):
            h = self.native_step.run(h.contiguous(), positions, meta, lora=self._native_lora())
        else:
            h = self.run_layers(h, self.ropes(positions), kv_caches, meta, 0, len(self.layers))
        return self.final_norm(h)

    def ropes(self, positions: torch.Tensor) -> dict[int, Rope]:
        """Each rotary table's cos and sin at `positions`, by id(): what the layers of one pass read."""
        return {id(rotary): rotary.lookup(positions) for rotary in self.rotaries}

    def run_layers(self, h: torch.Tensor, ropes: dict[int, Rope], kv_caches: list[tuple[KVCache, KVCache]],
                   meta: AttentionMetadata, start: int, stop: int) -> torch.Tensor:
        """Layers [start, stop) of a pass over h (forward's own loop): a pass split into several calls computes
        the same bits as one."""
        for layer, kv in islice(zip(self.layers, kv_caches), start, stop):  # a ModuleList slice builds a new one
            h = layer(h, ropes, kv, meta)
        return h

    def final_norm(self, h: torch.Tensor) -> torch.Tensor:
        """The last layer's output normed (a stage before the last has no norm: its layers' output as it is)."""
        return self.norm(h) if self.norm is not None else h

    @torch.inference_mode()
    def forward_logits(self, input_ids: torch.Tensor, positions: torch.Tensor,
                       kv_caches: list[tuple[KVCache, KVCache]], meta: AttentionMetadata, logit_rows: torch.Tensor,
                       vocab_rows: int = 0) -> torch.Tensor:
        """forward, then compute_logits of the flat rows `logit_rows`: float32 [len(logit_rows), V]. A decode step
        scoring the whole vocabulary goes from the token ids (or the embeddings) to the logits in one native call."""
        step = self.native_step
        if not vocab_rows and self._native_step_runs(meta, kv_caches) and step.scores:
            h = None if step.embeds else self.embed(input_ids).contiguous()
            return step.run(h, positions, meta, logit_rows, input_ids, self._native_lora())
        hidden = self(input_ids, positions, kv_caches, meta)
        if not len(logit_rows):
            return hidden.new_empty((0, self.cfg.vocab_size), dtype=torch.float32)
        return self.compute_logits(hidden[logit_rows], vocab_rows)

    @torch.inference_mode()
    def forward_hidden(self, input_ids: torch.Tensor, positions: torch.Tensor,
                       kv_caches: list[tuple[KVCache, KVCache]], meta: AttentionMetadata,
                       logit_rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """forward, returning float32 logits of `logit_rows` and the final (normed) hidden states [T, H] of every row:
        a step holding pooling requests (tally/engine/pooling.py) reads both."""
        hidden = self(input_ids, positions, kv_caches, meta)
        if not len(logit_rows):
            return hidden.new_empty((0, self.cfg.vocab_size), dtype=torch.float32), hidden
        return self.compute_logits(hidden[logit_rows]), hidden

    def runs_greedy_steps(self, kv_caches: list[tuple[KVCache, KVCache]]) -> bool:
        """Whether decode steps can run several at a time in one native call (greedy_steps)."""
        step = self.native_step
        return step is not None and step.runs_greedy and step.applies(self, kv_caches)

    @torch.inference_mode()
    def greedy_steps(self, input_ids: torch.Tensor, positions: torch.Tensor,
                     kv_caches: list[tuple[KVCache, KVCache]], meta: AttentionMetadata, steps: int,
                     stop_ids: list[tuple[int, ...]]) -> torch.Tensor:
        """Up to `steps` greedy decode steps of a decode-only batch (where runs_greedy_steps): each row's argmax feeds
        its next step, until every row has made one of its `stop_ids`. The rows' blocks must have room for them.
        Returns the tokens int64 [n, steps run]."""
        if not (meta.is_decode_only and self.runs_greedy_steps(kv_caches)):
            raise ValueError("greedy_steps runs decode-only steps on a native step from token ids to logits")
        return self.native_step.greedy(input_ids, positions, meta, steps, stop_ids, self._native_lora())

    def _native_step_runs(self, meta: AttentionMetadata, kv_caches: list[tuple[KVCache, KVCache]]) -> bool:
        step = self.native_step
        return step is not None and meta.is_decode_only and step.applies(self, kv_caches)

    def _native_lora(self) -> int | None:
        """The address of the step's adapters as the one-call step adds their deltas (tally/native/lora_delta.py),
        or None: no adapter row in this step."""
        native = self.lora.native if self.lora is not None and self.lora.active else None
        return None if native is None else native.address

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The first layer's input [T, H] for token ids: what forward starts from."""
        if self.tp is not None:  # vocabulary-parallel: each rank looks up its own rows, zeros elsewhere, summed
            ids = ids - self.vocab_start
            outside = (ids < 0) | (ids >= self.vocab_rows)
            ids = ids.masked_fill(outside, 0)
        if self.embed_tokens is None:
            h = (self.embed_blocks if self.embed_blocks is not None else self.lm_head).embedding_rows(ids)
        else:
            h = F.embedding(ids, self.embed_tokens).to(self.dtype)
        if self.tp is not None:
            h = self.tp.all_reduce(h.masked_fill(outside[:, None], 0))
        if self.cfg.embedding_multiplier != 1.0:  # in the model's dtype, as Gemma rounds its sqrt(hidden)
            h = h * torch.tensor(self.cfg.embedding_multiplier, dtype=h.dtype)
        return h

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor, vocab_rows: int = 0) -> torch.Tensor:
        """hidden [N, H] → float32 logits [N, V]. vocab_rows > 0: only token ids below it are scored, the rest -inf
        (a draft model's reduced vocabulary: tally/engine/speculation/config.py, draft_vocab_size)."""
        if not vocab_rows:
            return self._finish_logits(self.lm_head(hidden)).float()
        logits = torch.full((hidden.shape[0], self.cfg.vocab_size), float("-inf"))
        logits[:, :vocab_rows] = self._finish_logits(self.lm_head.first_outputs(hidden, vocab_rows))
        return logits

    def _finish_logits(self, logits: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        if cfg.logits_scaling != 1.0:
            logits = logits / cfg.logits_scaling
        cap = cfg.final_logit_softcap
        if cap is not None and logits.dtype == torch.float32 and native.available():  # the one-call step's bits
            logits = native.softcap_rows(logits.reshape(-1, logits.shape[-1]), cap).view(logits.shape)
        elif cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits
