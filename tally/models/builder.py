"""Checkpoint tensors (HF names) → a CausalLM with fused projections, quantized if asked.

A projection comes from one of three places: a pre-quantized Tally checkpoint (`*.qweight` tensors, see
docs/quantization.md), the GGUF file's own blocks (`quantization="gguf"`: adopted as stored, no requantization),
or a dense weight (quantized on the fly with RTN when `quantization` names a scheme)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from tally.attention.backend import make_backend
from tally.attention.interface import AttentionBackend
from tally.errors import ConfigError, ModelLoadError
from tally.layers.dense import ConcatLinear
from tally.layers.huge_pages import move_weights_to_huge_pages
from tally.layers.linear import build_linear, linear_from_blocks, linear_from_gguf
from tally.layers.parallel import GatheredParallel, RowParallel, TPGroup, VocabParallelHead, WholeHeads
from tally.models.config import ModelConfig
from tally.models.decoder import CausalLM
from tally.models.native_decode_step import NativeDecodeStep
from tally.models.packed_checkpoint import linear_from_packed
from tally.models.pipeline_split import PPStage
from tally.models.tensor_map import Reader, TensorMap
from tally.models.tensor_parallel import TPShard
from tally.quant.gguf_blocks import BLOCK, Blocks, concat_blocks, read_blocks

if TYPE_CHECKING:
    from tally.models.loader import Checkpoint


def model_attention(name: str, cfg: ModelConfig, compute_dtype: torch.dtype = torch.float32) -> AttentionBackend:
    """The attention backend called `name` for the model's layers (build_model gives layers of another window
    their own)."""
    return make_backend(name, num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                        scale=cfg.attention_scale, sliding_window=cfg.sliding_window, compute_dtype=compute_dtype,
                        logit_softcap=cfg.attn_logit_softcap)


def build_model(config: ModelConfig, tensors: TensorMap | dict[str, torch.Tensor], *, dtype: torch.dtype,
                quantization: str | None, attn: AttentionBackend, max_model_len: int,
                checkpoint: Checkpoint | None = None, weight_dtype: torch.dtype | None = None,
                parallel: tuple[TPShard, TPGroup] | None = None, stage: PPStage | None = None) -> CausalLM:
    """Consumes `tensors` (popped as used, so peak memory stays near one copy of the weights; a TensorMap reads
    each when taken, and a GGUF projection served as its stored blocks is never read as floats).
    `checkpoint` is needed for `quantization="gguf"` (its raw blocks) and for pre-quantized checkpoints.
    `weight_dtype=torch.float16` stores dense projections, the embedding and the head in fp16 (fp32 compute);
    `torch.float32` keeps fp32 projections on the native panels (tally/layers/linear.py build_linear).
    `parallel`: this rank's slice under tensor parallelism; `config` and `tensors` (stored integers too) are
    already that slice's (TPShard.local_config, TPShard.shard), GGUF blocks are sliced here. `stage`: this
    pipeline stage's layers; `tensors` holds only the stage's own (PPStage.holds)."""
    prequantized = checkpoint.quantization if checkpoint is not None else None
    _check_quantization(quantization, checkpoint, prequantized)
    shard, tp = parallel if parallel is not None else (None, None)
    tensors = tensors if isinstance(tensors, TensorMap) else TensorMap.of(tensors)

    def take(name: str) -> Reader:
        try:
            return tensors.take(name)
        except KeyError as exc:
            raise ModelLoadError(f"checkpoint is missing tensor {name!r}") from exc

    def pop(name: str) -> torch.Tensor:
        return take(name)()

    def make_proj(names: list[str], bias: bool) -> nn.Module:
        layer = _make_proj(names, bias)
        # experts are whole on each rank, or their partial sums all-reduced once for all of them (MixtureOfExperts)
        if tp is None or not names[0].endswith(("o_proj", "down_proj")) or ".experts." in names[0]:
            return layer
        if shard.partial_sums:
            return RowParallel(layer, tp)
        split_input = shard.widths["attention" if names[0].endswith("o_proj") else "mlp"]
        return GatheredParallel(layer, tp, split_input, shard.widths["hidden"])

    def _make_proj(names: list[str], bias: bool) -> nn.Module:
        biases = [pop(f"{n}.bias") for n in names] if bias else None
        b = None if biases is None else torch.cat(biases)
        if prequantized is not None and f"{names[0]}.qweight" in tensors:
            return linear_from_packed(prequantized, [_pop_packed(n, pop, tensors) for n in names], b, dtype)
        if quantization == "gguf":
            return _gguf_proj(checkpoint, names, [take(f"{n}.weight") for n in names], biases, dtype, weight_dtype,
                              shard)
        weight = torch.cat([pop(f"{n}.weight") for n in names])
        return build_linear(weight, b, quantization=None if prequantized else quantization, dtype=dtype,
                            weight_dtype=weight_dtype)

    def make_head(weight: Reader, tied: bool) -> nn.Module:
        head = _make_head(weight, tied)
        return head if tp is None else VocabParallelHead(head, tp, shard.widths["vocab"])

    def _make_head(weight: Reader, tied: bool) -> nn.Module:
        # Quantized models quantize the LM head too, to int8 (llama.cpp's 4-bit files keep it at 6-8 bits): at
        # one token per step SmolLM2's fp32 head alone reads 113 MB, as much as all its int4 layers together.
        name = "model.embed_tokens" if tied else "lm_head"
        if quantization == "gguf" and checkpoint.gguf_tensor(f"{name}.weight") is not None:
            return _gguf_proj(checkpoint, [name], [weight], None, dtype, weight_dtype, shard)
        head_scheme = "int8" if quantization in ("int4", "int8") and not prequantized else None
        return build_linear(weight(), None, quantization=head_scheme, dtype=dtype, weight_dtype=weight_dtype)

    def make_embedding() -> nn.Module | None:
        # A GGUF's quantized table is served from its blocks, as its head would be (a rank: its vocabulary rows), so
        # every rank looks up the very values one process does
        name = "model.embed_tokens.weight"
        raw = checkpoint.gguf_tensor(name) if quantization == "gguf" else None
        if raw is None:
            return None
        if shard is None:
            layer = linear_from_gguf(raw, None, compute_dtype=dtype)
        else:
            blocks = _shard_blocks(read_blocks(raw), shard.rows(name), None)
            layer = linear_from_blocks(blocks, None, compute_dtype=dtype) if blocks is not None else None
        return layer if hasattr(layer, "embedding_rows") else None

    cfg = config
    if max_model_len < cfg.max_position_embeddings:
        # The rotary table only needs the positions the engine will ever use.
        cfg = replace(cfg, max_position_embeddings=max_model_len)
    whole_heads = None
    if shard is not None and cfg.qk_norm == "projection":
        whole_heads = WholeHeads(tp, shard.widths["attention"], shard.widths["kv"], shard.kv_starts, cfg.head_dim)
    try:
        model = CausalLM(cfg, tensors, make_proj, make_head, attn, dtype, weight_dtype, tp,
                         shard.vocab if shard is not None else (0, cfg.vocab_size), stage, make_embedding, whole_heads)
    except KeyError as exc:
        raise ModelLoadError(f"checkpoint is missing tensor {exc.args[0]!r}") from exc
    tensors.finish()
    leftover = [n for n in tensors if "rotary_emb" not in n]
    if leftover:
        raise ModelLoadError(f"checkpoint has tensors this architecture does not use: {leftover[:5]}")
    model.huge_page_bytes = move_weights_to_huge_pages(model)  # before anything takes the weights' addresses
    model.native_step = NativeDecodeStep.build(model)
    return model.eval()


def _check_quantization(quantization: str | None, checkpoint: Checkpoint | None, prequantized: str | None) -> None:
    if prequantized is not None and quantization not in (None, "none"):
        raise ConfigError(f"{checkpoint.path} is already quantized ({prequantized}); drop quantization="
                          f"{quantization!r} to serve it as written", param="quantization")
    if quantization == "gguf" and (checkpoint is None or checkpoint.format != "gguf"):
        where = checkpoint.path if checkpoint is not None else "this checkpoint"
        raise ConfigError(f"quantization='gguf' serves a GGUF file's blocks as stored, but {where} is not a GGUF "
                          "file; use int8, int4 or w8a8 to quantize it on the fly", param="quantization")


def _pop_packed(name: str, pop: Callable[[str], torch.Tensor],
                tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """{qweight, scales[, zeros]} of one HF projection name."""
    parts = {"qweight": pop(f"{name}.qweight"), "scales": pop(f"{name}.scales")}
    if f"{name}.zeros" in tensors:
        parts["zeros"] = pop(f"{name}.zeros")
    return parts


def _gguf_proj(checkpoint: Checkpoint, names: list[str], dense: list[Reader],
               biases: list[torch.Tensor] | None, dtype: torch.dtype, weight_dtype: torch.dtype | None,
               shard: TPShard | None = None) -> nn.Module:
    """One layer over the GGUF blocks of `names`: rows concatenated when their types (or the kernels they load
    into) match, else one layer per name behind ConcatLinear. Types the quantized layers do not adopt (F16, Q6_K)
    use the dequantized weight, in fp16 panels when `weight_dtype` says so (half of fp32's bytes per step), read from
    `dense` only then. `shard`: only this rank's slice of the blocks (`dense` and `biases` are sliced already)."""
    raws = [checkpoint.gguf_tensor(f"{n}.weight") for n in names]
    b = None if biases is None else torch.cat(biases)

    def dense_layer(weights: list[Reader], bias: torch.Tensor | None) -> nn.Module:
        weight = torch.cat([read() for read in weights])
        return build_linear(weight, bias, quantization=None, dtype=dtype, weight_dtype=weight_dtype)

    if shard is None and len({r.ggml_type for r in raws}) == 1:
        return linear_from_gguf(_concat_raw(raws), b, compute_dtype=dtype) or dense_layer(dense, b)
    blocks = [read_blocks(r) for r in raws]
    if shard is not None:
        blocks = [_shard_blocks(blk, shard.rows(f"{n}.weight"), shard.columns(f"{n}.weight"))
                  for blk, n in zip(blocks, names)]
    if all(blk is None for blk in blocks):
        return dense_layer(dense, b)
    merged = concat_blocks(blocks)  # e.g. Q5_0 and Q8_0 rows: both int8, still one layer
    if merged is not None:
        return linear_from_blocks(merged, b, compute_dtype=dtype) or dense_layer(dense, b)
    parts = []
    for i, (blk, read) in enumerate(zip(blocks, dense)):
        bi = None if biases is None else biases[i]
        parts.append(linear_from_blocks(blk, bi, compute_dtype=dtype) or dense_layer([read], bi))
    return ConcatLinear(parts)


def _shard_blocks(blocks: Blocks | None, rows: slice | None, cols: slice | None) -> Blocks | None:
    """A rank's rows and columns of stored blocks; None (the caller uses the dense slice) where a column split
    would cut a block of 32."""
    if blocks is None or (cols is not None and (cols.start % BLOCK or cols.stop % BLOCK)):
        return None
    rows = rows or slice(None)
    cols = cols or slice(0, blocks.q.shape[1])
    group = blocks.q.shape[1] // blocks.scale.shape[1]
    groups = slice(cols.start // group, cols.stop // group)
    per_group = [getattr(blocks, f)[rows, groups].contiguous() for f in ("scale", "zero") if hasattr(blocks, f)]
    # the file's factors (Int4Blocks, OffsetBlocks) are dropped: the kernels take the sliced values as they are
    factors = {"factors": None} if getattr(blocks, "factors", None) is not None else {}
    return replace(blocks, q=blocks.q[rows, cols].contiguous(), **dict(zip(("scale", "zero"), per_group)), **factors)


def _concat_raw(raws: list[Any]) -> Any:
    """The raw tensors' rows stacked into one (same ggml type, same row width): a fused projection's blocks."""
    if len(raws) == 1:
        return raws[0]
    import numpy as np

    data = np.concatenate([np.ascontiguousarray(r.data) for r in raws])
    return replace(raws[0], shape=(sum(r.shape[0] for r in raws), raws[0].shape[1]), data=data)
