"""A decode step through every layer in one native call (kernels.c: tally_decode_layers), from the embeddings or the
token ids to the last layer's output or the logits of the rows that sample, and the ctypes mirrors of the C structs
it reads (tests/test_native_mirrors.py holds them to kernels.c). One call because at one token a step, the
interpreter and dispatch between per-layer kernels cost as much as their arithmetic: docs/benchmarks.md#decode-roofline.
"""
from __future__ import annotations

import ctypes
import itertools
from typing import Protocol, Sequence

import torch
from torch import nn

from tally.attention.interface import AttentionBackend
from tally.attention.kv_cache import Int8KVCache, KVCache
from tally.attention.metadata import AttentionMetadata
from tally.layers.dense import ConcatLinear, Fp16WeightLinear
from tally.layers.norm import RMSNorm
from tally.layers.parallel import TPGroup
from tally.layers.rotary import RotaryEmbedding
from tally.models.config import ModelConfig
from tally.models.native_traits import layer_unsupported
from tally.native.library import load
from tally.native.ops import ACTIVATIONS, KV_INT8, KV_KINDS, scale_form
from tally.quant.native_linear import (
    NativeInt4Linear,
    NativeInt8Linear,
    NativeW8A8Linear,
)

_P, _I = ctypes.c_void_p, ctypes.c_int64
PROJ_Q4, PROJ_Q8, PROJ_F16, PROJ_W8A8, PROJ_CONCAT, PROJ_F32 = 1, 2, 3, 4, 5, 6  # Proj.kind, as kernels.c's enum
PANEL_KINDS = {torch.float16: PROJ_F16, torch.float32: PROJ_F32}


class StepExperts(Protocol):
    """What the step reads of a layer's mixture of experts (tally/models/experts.py): its native call's struct."""

    def native(self) -> NativeExpertsCall | None: ...


class NativeExpertsCall(Protocol):
    address: int  # of its C struct (tally/native/experts.h: Experts), alive as long as the model


class StepLayer(Protocol):
    """What the step reads of a decoder layer (tally/models/decoder.py: DecoderLayer)."""

    native: bool
    input_norm: RMSNorm | None  # None where the family has no such norm (OLMo 2: output norms only)
    post_attn_norm: RMSNorm | None
    attn_output_norm: RMSNorm | None
    mlp_output_norm: RMSNorm | None
    q_norm: RMSNorm | None
    k_norm: RMSNorm | None
    rotary: RotaryEmbedding | None  # None: a layer without rotary
    attn: AttentionBackend  # its config holds the layer's window, score scale, soft cap and sinks
    qkv_proj: nn.Module
    o_proj: nn.Module
    experts: StepExperts | None  # in place of gate_up_proj and down_proj (a mixture of experts' layer)
    gate_up_proj: nn.Module
    down_proj: nn.Module
    key_scale: torch.Tensor | None  # the int8 KV cache's key smoothing, or None
    query_scale: torch.Tensor | None


class StepModel(Protocol):
    """What the step reads of the model (tally/models/decoder.py: CausalLM, which imports this module)."""

    cfg: ModelConfig
    layers: Sequence[StepLayer]
    rotary: RotaryEmbedding  # the full-attention layers' table (rotary_dim: how much of a head rotates)
    rotaries: Sequence[RotaryEmbedding]  # every table a layer rotates with
    norm: RMSNorm | None  # None, as lm_head, on a pipeline stage before the last
    lm_head: nn.Module | None
    tp: TPGroup | None
    embed_tokens: torch.Tensor | None
    embed_blocks: nn.Module | None


class _Proj(ctypes.Structure):
    _fields_ = [("kind", _I), ("n", _I), ("k", _I), ("group", _I), ("bits", _I), ("w", _P), ("scale", _P),
                ("min", _P), ("bias", _P), ("high", _P), ("scale_form", _I)]


class _Layer(ctypes.Structure):
    _fields_ = [("input_norm", _P), ("post_norm", _P), ("attn_out_norm", _P), ("mlp_out_norm", _P), ("q_norm", _P),
                ("k_norm", _P), ("cos", _P), ("sin", _P), ("window", _I), ("sinks", _P), ("qkv", _Proj), ("o", _Proj),
                ("gate_up", _Proj), ("down", _Proj), ("k_cache", _P), ("v_cache", _P), ("kv_kind", _I),
                ("k_scales", _P), ("v_scales", _P), ("key_scale", _P), ("query_scale", _P), ("experts", _P)]


class _Model(ctypes.Structure):
    _fields_ = [("num_layers", _I), ("hidden", _I), ("heads", _I), ("kv_heads", _I), ("head_dim", _I),
                ("intermediate", _I), ("block_size", _I), ("rotary_dim", _I), ("qk_norm_whole", _I),
                ("activation", _I), ("scale", ctypes.c_float), ("eps", ctypes.c_float), ("softcap", ctypes.c_float),
                ("embedding_multiplier", ctypes.c_float), ("residual_multiplier", ctypes.c_float),
                ("logits_scaling", ctypes.c_float), ("final_softcap", ctypes.c_float),
                ("swiglu_alpha", ctypes.c_float), ("swiglu_limit", ctypes.c_float),
                ("layers", ctypes.POINTER(_Layer)), ("final_norm", _P), ("head", _Proj), ("embed", _Proj),
                ("lora", _P)]


def _proj(module: nn.Module, keep: list[ctypes.Array[_Proj]]) -> _Proj | None:
    """The projection as the kernels run it, or None where they cannot. `keep`: where the C arrays the struct points
    at are held for as long as the step lives."""
    if isinstance(module, ConcatLinear):  # outputs side by side, each part in its own native format
        parts = [_proj(part, keep) for part in module.parts]
        if any(p is None for p in parts):
            return None
        array = (_Proj * len(parts))(*parts)
        keep.append(array)
        return _Proj(PROJ_CONCAT, sum(p.n for p in parts), parts[0].k, len(parts), 0, ctypes.addressof(array))
    if isinstance(module, Fp16WeightLinear) and module.panels is not None:  # fp16 or fp32 panels
        if module.panel_dtype not in PANEL_KINDS:  # bf16 panels serve bf16 compute, which this step does not run
            return None
        bias = None if module.bias is None else module.bias.data_ptr()
        kind = PANEL_KINDS[module.panel_dtype]
        return _Proj(kind, module.out_features, module.in_features, 0, 0, module.panels.data_ptr(), None, None,
                     bias)
    if not isinstance(module, (NativeInt4Linear, NativeInt8Linear)):
        return None
    if isinstance(module, NativeW8A8Linear) and module.act_inv_smooth is not None:
        return None  # its smoothing is a step of its own
    bias = None if module.bias is None else module.bias.data_ptr()
    if isinstance(module, NativeInt4Linear):
        m, qh = (None if a is None else a.data_ptr() for a in (module.m, module.qh))
        return _Proj(PROJ_Q4, module.out_features, module.in_features, module.group_size, module.bits,
                     module.qs.data_ptr(), module.d.data_ptr(), m, bias, qh, scale_form(module.d, module.m))
    return _Proj(PROJ_W8A8 if module.per_token else PROJ_Q8, module.out_features, module.in_features,
                 module.group_size, 7 if module.symmetric else 8, module.q.data_ptr(), module.s.data_ptr(), None,
                 bias, None, scale_form(module.s))


def _head(model: StepModel, keep: list[ctypes.Array[_Proj]]) -> _Proj | None:
    """The LM head as the step can run it after the layers (final norm included), or None: no head on this rank
    (a pipeline stage before the last), a vocabulary-parallel one, or a norm or head the kernels do not run."""
    if model.lm_head is None or model.norm is None or not model.norm.native or model.tp is not None:
        return None
    if model.norm.eps != model.cfg.rms_norm_eps:
        return None
    head = _proj(model.lm_head, keep)
    return head if head is not None and head.n == model.cfg.vocab_size else None


def _token_table(model: StepModel, keep: list[ctypes.Array[_Proj]]) -> _Proj | None:
    """The token table as int4 / int8 rows the step can look up itself (a GGUF table's own blocks, or a tied head's),
    or None: the caller embeds (a plain table, fp16 panels, vocabulary-parallel rows)."""
    if model.tp is not None or model.embed_tokens is not None:
        return None
    table = _proj(model.embed_blocks if model.embed_blocks is not None else model.lm_head, keep)
    return table if table is not None and table.kind in (PROJ_Q4, PROJ_Q8, PROJ_W8A8) else None


class NativeDecodeStep:
    """The model described to C once: weight pointers, norms, rotary tables. The structs hold raw pointers, valid
    because the model's tensors are never replaced after loading (in-place changes, such as the quality gate's
    deliberate zeroing, are seen); the KV caches' pointers are checked each step (`applies`).

    Where the final norm and the LM head are native as well (`scores`) a step can end in the logits of the rows that
    sample, and where the token table is int4 / int8 rows (`embeds`) start from the token ids: after the weights'
    stream every Python and torch call starts from cold caches (docs/benchmarks.md#decode-roofline)."""

    def __init__(self, model: StepModel, layers: list[_Layer], keep: list[ctypes.Array[_Proj] | torch.Tensor]) -> None:
        cfg = model.cfg
        self._keep = keep  # the parts of concatenated projections and the sinks' logits, which the layers point at
        self._layers = (_Layer * len(layers))(*layers)
        head, table = _head(model, keep), _token_table(model, keep)
        self.scores = head is not None  # whether a step can end in the logits
        self.embeds = table is not None  # whether it can start from the token ids
        self._vocab = cfg.vocab_size
        attention = model.layers[0].attn.config
        self._model = _Model(len(layers), cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                             cfg.intermediate_size, 0, model.rotary.rotary_dim, cfg.qk_norm == "projection",
                             ACTIVATIONS[cfg.activation], attention.scale, cfg.rms_norm_eps,
                             attention.logit_softcap or 0.0, cfg.embedding_multiplier, cfg.residual_multiplier,
                             cfg.logits_scaling, cfg.final_logit_softcap or 0.0, cfg.swiglu_alpha, cfg.swiglu_limit,
                             self._layers,
                             model.norm.weight.data_ptr() if head else None, head or _Proj(), table or _Proj())
        self._caches: list[tuple[KVCache, KVCache]] | None = None

    @classmethod
    def build(cls, model: StepModel) -> NativeDecodeStep | None:
        """The step, or None (the model runs layer by layer) unless the kernels are loaded, every layer runs them
        (native_traits.layer_unsupported is empty; a mixture of experts has its native call) and every projection is a
        native int4 / int8 / W8A8 layer (tally/quant/native_linear.py), fp16 panels (tally/layers/dense.py) or several
        of them side by side (ConcatLinear: a GGUF's fused q/k/v whose parts are stored in different block types)."""
        if load() is None or layer_unsupported(model.cfg) or not all(layer.native for layer in model.layers):
            return None
        if any(rotary.cos.dtype != torch.float32 or not rotary.cos.is_contiguous() for rotary in model.rotaries):
            return None
        layers, keep = [], []
        for layer in model.layers:
            experts = None if layer.experts is None else layer.experts.native()
            if layer.experts is not None and experts is None:
                return None
            mlp = (layer.gate_up_proj, layer.down_proj) if experts is None else ()
            projs = [_proj(m, keep) for m in (layer.qkv_proj, layer.o_proj, *mlp)]
            if any(p is None for p in projs):
                return None
            projs += [_Proj(), _Proj()] if experts is not None else []
            norms = [_weight(n) for n in (layer.input_norm, layer.post_attn_norm, layer.attn_output_norm,
                                          layer.mlp_output_norm, layer.q_norm, layer.k_norm)]
            rotary = layer.rotary
            table = (None, None) if rotary is None else (rotary.cos.data_ptr(), rotary.sin.data_ptr())
            attention = layer.attn.config
            sinks = attention.sink_logits()  # GPT-OSS's, or None
            keep += [] if sinks is None else [sinks]
            layer_struct = _Layer(*norms, *table, attention.sliding_window or 0,
                                  None if sinks is None else sinks.data_ptr(), *projs)
            layer_struct.experts = None if experts is None else experts.address
            layers.append(layer_struct)
        return cls(model, layers, keep)

    def applies(self, model: StepModel, kv_caches: list[tuple[KVCache, KVCache]]) -> bool:
        """Whether this step can run: fp32, fp16 or bf16 caches, or the int8 cache (with its key smoothing)."""
        if kv_caches is not self._caches:
            k0 = kv_caches[0][0]
            int8 = isinstance(k0, Int8KVCache)
            if not (int8 or (isinstance(k0, torch.Tensor) and k0.dtype in KV_KINDS)):
                return False
            for layer, decoder, (k, v) in zip(self._layers, model.layers, kv_caches):
                layer.kv_kind = KV_INT8 if int8 else KV_KINDS[k.dtype]
                if int8:
                    layer.k_cache, layer.v_cache = k.values.data_ptr(), v.values.data_ptr()
                    layer.k_scales, layer.v_scales = k.scales.data_ptr(), v.scales.data_ptr()
                else:
                    layer.k_cache, layer.v_cache = k.data_ptr(), v.data_ptr()
                    layer.k_scales = layer.v_scales = None
                smoothed = decoder.key_scale is not None
                layer.key_scale = decoder.key_scale.data_ptr() if smoothed else None
                layer.query_scale = decoder.query_scale.data_ptr() if smoothed else None
            self._model.block_size = k0.shape[1]
            self._caches = kv_caches
        return True

    def run(self, h: torch.Tensor | None, positions: torch.Tensor, meta: AttentionMetadata,
            logit_rows: torch.Tensor | None = None, ids: torch.Tensor | None = None,
            lora: int | None = None) -> torch.Tensor:
        """h [n, hidden] fp32 contiguous, or None: the call looks up the embeddings of the token `ids` [n] itself
        (needs `embeds`); positions [n], a decode-only step's meta. Returns the last layer's output (in h); or with
        `logit_rows` (rows of it; needs `scores`) their float32 logits [len(logit_rows), V], the final norm and the
        LM head run in the same call. `lora`: the address of the step's LoRA adapters (tally/native/lora_delta.py),
        whose per-row deltas the call adds after each projection."""
        n = len(positions)
        table_ids = None
        if h is None:  # the call embeds
            table_ids = _int64(ids)
            h = torch.empty(n, self._model.hidden, dtype=torch.float32)
        positions = _int64(positions)
        lens = _context_lens(meta, n)
        tables = meta.block_tables
        rows, logits = None, None
        if logit_rows is not None:
            rows = _int64(logit_rows)
            logits = torch.empty(len(rows), self._vocab, dtype=torch.float32)
        self._model.lora = lora
        try:
            status = load().tally_decode_layers(
                ctypes.byref(self._model), h.data_ptr(), n, None if table_ids is None else table_ids.data_ptr(),
                positions.data_ptr(), meta.slot_mapping.data_ptr(), tables.data_ptr(), tables.stride(0),
                lens.data_ptr(), None if rows is None else rows.data_ptr(), 0 if rows is None else len(rows),
                None if logits is None else logits.data_ptr())
        finally:
            self._model.lora = None
        if status < 0:
            raise self._outside(table_ids)
        return h if logits is None else logits

    @property
    def runs_greedy(self) -> bool:
        """Whether `greedy` can run: the call goes from the token ids to the logits."""
        return self.scores and self.embeds

    def greedy(self, ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, steps: int,
               stop_ids: list[tuple[int, ...]], lora: int | None = None) -> torch.Tensor:
        """Up to `steps` greedy decode steps of a decode-only batch in one call (needs `runs_greedy`): each row's
        argmax, the first index of its maximum as torch.argmax's, is its next token at the next position. The call
        ends early after the step where every row has made one of its `stop_ids`. The rows' blocks must have room
        for the steps' tokens (meta's block tables hold them). `lora` as run's: each row keeps its adapter throughout.
        Returns the tokens int64 [n, steps run]."""
        n = len(positions)
        ids, positions, lens, tables = _int64(ids), _int64(positions), _context_lens(meta, n), meta.block_tables
        flat = torch.tensor([t for row in stop_ids for t in row], dtype=torch.int64)
        stop_at = torch.tensor([0, *itertools.accumulate(len(row) for row in stop_ids)], dtype=torch.int64)
        out = torch.empty(n, steps, dtype=torch.int64)
        self._model.lora = lora
        try:
            ran = load().tally_decode_greedy(ctypes.byref(self._model), n, ids.data_ptr(), positions.data_ptr(),
                                             tables.data_ptr(), tables.stride(0), lens.data_ptr(), steps,
                                             flat.data_ptr(), stop_at.data_ptr(), out.data_ptr())
        finally:
            self._model.lora = None
        if ran < 0:
            raise self._outside(ids)
        return out[:, :ran]

    def _outside(self, ids: torch.Tensor) -> IndexError:
        """The call ran nothing: as PyTorch's indexing, an error."""
        return IndexError(f"token ids {ids.tolist()[:5]} reach outside a table of {self._model.embed.n} rows")


def _weight(norm: RMSNorm | None) -> int | None:
    return None if norm is None else norm.weight.data_ptr()


def _context_lens(meta: AttentionMetadata, n: int) -> torch.Tensor:
    return meta.memo("context_lens", lambda: torch.tensor(meta.context_lens[:n], dtype=torch.int64))


def _int64(t: torch.Tensor) -> torch.Tensor:
    """As the C step reads indices: int64, contiguous (what the engine's inputs already are: no copy then)."""
    return t if t.dtype == torch.int64 and t.is_contiguous() else t.to(torch.int64).contiguous()
