"""Tensor parallel: which slice of each weight one rank holds (Megatron's split, made exact).

Column-parallel (each rank computes some output features): the fused QKV projection by attention heads, gate/up
by intermediate columns, the embedding and the LM head by vocabulary rows. o_proj and down_proj are split by their
outputs too (the hidden size): their input, which arrives split by heads or columns, is all-gathered first, so every
output is one rank's whole dot product, bitwise one process's (tally/layers/parallel.py:GatheredParallel). Norms are
replicated; a norm over the whole q or k projection (OLMo 2) gathers every rank's q and k first, one more
all-gather. A layer makes four all-gathers. A mixture of experts is held whole on every rank: its native call
routes and sums each row in one fixed order, which a split of its columns would change.

With `partial_sums` (batch_invariant off) o_proj and down_proj are split by their inputs instead, as vLLM does: each
rank's output is a partial sum, all-reduced (two collectives a layer, in another summation order than one process);
each expert then splits the same way, its router replicated, and a row-parallel bias is held by rank 0 alone.

Heads go to ranks by whole KV groups, as evenly as they divide: with 3 KV heads on 2 ranks rank 0 holds 2 groups
and rank 1 one (vLLM refuses such a model; the sums do not care). With fewer KV heads than ranks, each KV head is
replicated on size / num_kv_heads ranks, as vLLM does. Rank 0 holds the largest slices, so its KV pool is the
largest and the pool it sizes fits every rank.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from tally.errors import ConfigError
from tally.models.config import ModelConfig

if TYPE_CHECKING:  # `tally plan` uses the split without torch
    import torch

# int4's groups and GGUF's 32-weight blocks: a split of the intermediate columns by inputs falls on these
_ALIGN = (128, 64, 32)


@dataclass(frozen=True)
class TPShard:
    """Rank `rank` of `size`: [start, end) of the KV heads, query heads, intermediate columns, vocabulary rows and
    hidden outputs (of o_proj and down_proj) it holds. `vocab_rows` is the widest rank's vocabulary width; `widths`
    every rank's width of the activations all-gathered: attention output, MLP columns, hidden state, logits."""

    rank: int
    size: int
    kv_heads: tuple[int, int]
    q_heads: tuple[int, int]
    intermediate: tuple[int, int]
    vocab: tuple[int, int]
    vocab_rows: int
    head_dim: int
    in_features: tuple[int, int]  # the whole model's inputs of o_proj and down_proj: q_size, intermediate_size
    expert_intermediate: tuple[int, int] = (0, 0)  # each expert's columns it holds (a mixture of experts)
    expert_in_features: int = 0  # the whole model's inputs of an expert's down_proj
    hidden: tuple[int, int] = (0, 0)
    widths: dict[str, tuple[int, ...]] | None = None  # "attention", "kv", "mlp", "hidden", "vocab"
    partial_sums: bool = False
    kv_starts: tuple[int, ...] = ()  # every rank's first KV head

    def local_config(self, cfg: ModelConfig) -> ModelConfig:
        """The config of this rank's slice: a smaller Llama with the same hidden size."""
        experts = cfg.experts
        if experts is not None and self.partial_sums:
            experts = replace(experts, intermediate_size=_width(self.expert_intermediate))
        return replace(cfg, num_heads=_width(self.q_heads), num_kv_heads=_width(self.kv_heads),
                       intermediate_size=_width(self.intermediate), experts=experts)

    def rows(self, name: str) -> slice | None:
        """The output rows of HF tensor `name` (weight or bias) this rank holds; None: not split by rows."""
        if ".q_proj." in name:
            return self._head_slice(self.q_heads)
        if name.endswith(".sinks"):  # one per query head (GPT-OSS)
            return slice(*self.q_heads)
        if ".k_proj." in name or ".v_proj." in name:
            return self._head_slice(self.kv_heads)
        if ".gate_proj." in name or ".up_proj." in name:
            if ".experts." not in name:
                return slice(*self.intermediate)
            return slice(*self.expert_intermediate) if self.partial_sums else None
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            return slice(*self.vocab)
        if not self.partial_sums and (".o_proj." in name or ".down_proj." in name) and ".experts." not in name:
            return slice(*self.hidden)
        return None

    def columns(self, name: str) -> slice | None:
        """The input columns of HF tensor `name` this rank holds (split by inputs); None: all of them."""
        if not self.partial_sums:
            return None
        if ".o_proj." in name:
            return self._head_slice(self.q_heads)
        if ".down_proj." in name:
            return slice(*(self.expert_intermediate if ".experts." in name else self.intermediate))
        return None

    def shard(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's part of one checkpoint tensor, as its own storage (the full tensor can then be freed).
        Stored integers split like the weight they hold: a packed int4 `qweight` [N, K/2] two columns per byte,
        group `scales` / `zeros` [N, K/g] one per group; per-channel scales [N] only by rows."""
        rows, cols = self.rows(name), self.columns(name)
        if cols is not None and name.endswith(".bias"):  # a row-parallel bias: rank 0's alone
            return tensor.clone() if self.rank == 0 else tensor.new_zeros(tensor.shape)
        if rows is not None:
            tensor = tensor[rows]
        if cols is not None and tensor.dim() == 2:
            whole = self.expert_in_features if ".experts." in name else self.in_features[".down_proj." in name]
            unit = whole // tensor.shape[1]  # weight columns per stored column
            if cols.start % unit or cols.stop % unit:
                raise ConfigError(f"{name} stores {unit} input columns per value, and this rank's columns "
                                  f"[{cols.start}, {cols.stop}) cut one; choose another tensor_parallel_size, or "
                                  "leave batch_invariant on (its split keeps every group whole)",
                                  param="tensor_parallel_size")
            tensor = tensor[:, cols.start // unit:cols.stop // unit]
        return tensor.clone() if rows is not None or cols is not None else tensor

    def _head_slice(self, heads: tuple[int, int]) -> slice:
        return slice(heads[0] * self.head_dim, heads[1] * self.head_dim)


def plan_shards(cfg: ModelConfig, size: int, partial_sums: bool = False) -> list[TPShard]:
    """Every rank's slice, or ConfigError naming why the model cannot be split `size` ways."""
    if size < 1:
        raise ConfigError(f"tensor_parallel_size must be ≥ 1, got {size}", param="tensor_parallel_size")
    heads, kv = cfg.num_heads, cfg.num_kv_heads
    group = heads // kv
    if not _heads_split(heads, kv, size):
        sizes = [n for n in range(1, heads + 1) if _heads_split(heads, kv, n)]
        raise ConfigError(
            f"tensor_parallel_size {size} cannot split this model's {heads} attention heads and {kv} KV heads (with "
            f"fewer KV heads than ranks, the ranks must be a multiple of the KV heads and divide the attention "
            f"heads); choose tensor_parallel_size from {sizes}", param="tensor_parallel_size")
    if kv >= size:
        kv_ranges = _even(kv, size)
        q_ranges = [(a * group, b * group) for a, b in kv_ranges]
    else:
        per_kv = size // kv  # ranks sharing (replicating) one KV head
        kv_ranges = [(r // per_kv, r // per_kv + 1) for r in range(size)]
        q_ranges = [(r * heads // size, (r + 1) * heads // size) for r in range(size)]
    inter = _columns(cfg.intermediate_size, size)
    expert_split = cfg.experts is not None and partial_sums
    expert = _columns(cfg.experts.intermediate_size, size) if expert_split else [(0, 0)] * size
    hidden = _columns(cfg.hidden_size, size)
    rows = -(-cfg.vocab_size // size)
    vocab = [(min(r * rows, cfg.vocab_size), min((r + 1) * rows, cfg.vocab_size)) for r in range(size)]
    widths = {"attention": tuple(_width(q) * cfg.head_dim for q in q_ranges), "mlp": tuple(map(_width, inter)),
              "hidden": tuple(map(_width, hidden)), "vocab": tuple(map(_width, vocab)),
              "kv": tuple(_width(k) * cfg.head_dim for k in kv_ranges)}
    return [TPShard(r, size, kv_ranges[r], q_ranges[r], inter[r], vocab[r], rows, cfg.head_dim,
                    (cfg.q_size, cfg.intermediate_size), expert[r],
                    cfg.experts.intermediate_size if expert_split else 0, hidden[r], widths, partial_sums,
                    tuple(k[0] for k in kv_ranges))
            for r in range(size)]


def _columns(width: int, size: int) -> list[tuple[int, int]]:
    """`width` features (an MLP's columns, the hidden size) in `size` ranges, on int4 group / GGUF block boundaries
    where they allow."""
    unit = next((a for a in _ALIGN if width % a == 0 and width // a >= size), 1)
    if width // unit < size:
        raise ConfigError(f"intermediate size {width} cannot be split {size} ways", param="tensor_parallel_size")
    return [(a * unit, b * unit) for a, b in _even(width // unit, size)]


def _heads_split(heads: int, kv: int, size: int) -> bool:
    return kv >= size or (size % kv == 0 and heads % size == 0)


def _even(n: int, parts: int) -> list[tuple[int, int]]:
    """[0, n) in `parts` contiguous ranges, the first ones larger by one where it does not divide."""
    bounds = [-(-n * r // parts) for r in range(parts + 1)]
    return list(zip(bounds, bounds[1:]))


def _width(span: tuple[int, int]) -> int:
    return span[1] - span[0]
