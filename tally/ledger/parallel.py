"""Tensor and pipeline parallel split: what one device holds, and the buffers it spends on talking.

TP shards every linear layer, the embedding and the head over `tp` ranks as the engine does
(tally/models/tensor_parallel.py:plan_shards: heads by whole KV groups, K/V projections replicated when
there are fewer KV heads than ranks; o_proj and down_proj by their outputs, experts whole, unless `partial_sums`);
norms are replicated. PP gives each stage a contiguous run of layers, as the
engine does (tally/models/pipeline_split.py): the first stage holds the embedding, the last the final norm and the
head (a copy of the embedding when tied). The plan is made for the fullest device: TP rank 0, which holds the
largest slices.
"""
from __future__ import annotations

from dataclasses import dataclass

from tally.ledger.weights import WeightFormat, WeightTensor
from tally.models.config import ModelConfig
from tally.models.pipeline_split import stage_of_layer
from tally.models.tensor_parallel import TPShard, plan_shards
from tally.units import MiB

# NCCL keeps NCCL_BUFFSIZE (4 MiB) per channel and direction; budget 32 channels x 2 directions.
NCCL_BYTES_PER_COMMUNICATOR = 4 * MiB * 32 * 2


@dataclass(frozen=True)
class DeviceSplit:
    tp: int
    pp: int
    stage_weight_bytes: tuple[int, ...]  # per device in each pipeline stage
    activation_buffer_bytes: int  # all-gathered activations (TP) and send/recv of hidden states (PP)
    nccl_bytes: int

    @property
    def weight_bytes(self) -> int:
        """Weights on the fullest device: what the memory plan must fit."""
        return max(self.stage_weight_bytes)

    @property
    def comm_buffer_bytes(self) -> int:
        return self.activation_buffer_bytes + self.nccl_bytes

    @property
    def num_devices(self) -> int:
        return self.tp * self.pp


def split_model(tensors: list[WeightTensor], fmt: WeightFormat, config: ModelConfig, *, tp: int, pp: int,
                max_batched_tokens: int, activation_bytes: int, nccl: bool = True,
                partial_sums: bool = False) -> DeviceSplit:
    """nccl: the devices talk through NCCL (GPUs), which keeps buffers of its own; gloo (CPU ranks) keeps none.
    partial_sums: the engine's split with batch_invariant off."""
    stage_bytes = [0.0] * pp
    fullest = plan_shards(config, tp, partial_sums)[0]
    for tensor in tensors:
        size = fmt.tensor_bytes(tensor) * _held_fraction(tensor, config, fullest)
        for stage in _stages_holding(tensor, config, pp):
            stage_bytes[stage] += size
    activation = activation_buffer_bytes(config, tp=tp, pp=pp, max_batched_tokens=max_batched_tokens,
                                         activation_bytes=activation_bytes, partial_sums=partial_sums)
    nccl_bytes = NCCL_BYTES_PER_COMMUNICATOR * ((tp > 1) + (pp > 1)) if nccl else 0
    return DeviceSplit(tp, pp, tuple(int(round(b)) for b in stage_bytes), activation, nccl_bytes)


def activation_buffer_bytes(config: ModelConfig, *, tp: int, pp: int, max_batched_tokens: int,
                            activation_bytes: int, partial_sums: bool = False) -> int:
    """The largest step's communication tensors: for TP the ranks' parts of the widest all-gather and their
    concatenation (an input and an output staging buffer of the all-reduce with partial sums); for PP send and
    receive of the hidden state and the residual stream. The engine's ledger shows the same figure for each rank
    (tally/engine/startup/load.py)."""
    hidden_bytes = max_batched_tokens * config.hidden_size * activation_bytes
    dense_mlp = any(not config.is_moe_layer(i) for i in range(config.num_layers))
    widest = max(config.hidden_size, config.q_size, config.intermediate_size if dense_mlp else 0)
    gathered_bytes = 2 * max_batched_tokens * widest * activation_bytes
    tp_bytes = (2 * hidden_bytes if partial_sums else gathered_bytes) if tp > 1 else 0
    return tp_bytes + (4 * hidden_bytes if pp > 1 else 0)


def _held_fraction(tensor: WeightTensor, config: ModelConfig, shard: TPShard) -> float:
    """The share of `tensor` that `shard` holds (1 for replicated tensors)."""
    if tensor.tp_split is None or shard.size == 1:
        return 1.0
    if tensor.role in ("embedding", "lm_head"):
        return shard.vocab_rows / config.vocab_size
    if not shard.partial_sums and ".experts." in tensor.name:
        return 1.0  # each rank holds the experts whole
    if not shard.partial_sums and tensor.tp_split == "cols":  # o_proj, down_proj: by their outputs instead
        return (shard.hidden[1] - shard.hidden[0]) / config.hidden_size
    split = tensor.rows if tensor.tp_split == "rows" else tensor.cols
    if tensor.kv_projection:
        return (shard.kv_heads[1] - shard.kv_heads[0]) / config.num_kv_heads
    if split == config.q_size:
        return (shard.q_heads[1] - shard.q_heads[0]) / config.num_heads
    if ".experts." in tensor.name:  # each expert by its own intermediate columns
        return (shard.expert_intermediate[1] - shard.expert_intermediate[0]) / config.experts.intermediate_size
    return (shard.intermediate[1] - shard.intermediate[0]) / config.intermediate_size


def _stages_holding(tensor: WeightTensor, config: ModelConfig, pp: int) -> tuple[int, ...]:
    if tensor.layer is not None:
        return (stage_of_layer(tensor.layer, config.num_layers, pp),)
    if tensor.role == "embedding":
        # A tied embedding is also the head, so the last stage keeps its own copy.
        return (0, pp - 1) if config.tie_word_embeddings and pp > 1 else (0,)
    return (pp - 1,)
