"""Assemble a capacity plan: model + format + device + workload -> bytes, fits, speeds, warnings."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from tally.ledger.capacity import (
    LongTailPlan,
    MemoryBudget,
    long_tail_plan,
    max_concurrency,
    memory_budget,
    oversubscription_warning,
)
from tally.ledger.comm import CommEstimate, Link, step_comm
from tally.ledger.kv import KVLayout, auto_kv_dtype, canonical_kv_dtype
from tally.ledger.length_percentiles import LengthStats
from tally.ledger.model_source import ModelSource
from tally.ledger.parallel import DeviceSplit, split_model
from tally.ledger.presets import Device
from tally.ledger.roofline import (
    DecodeEstimate,
    ModelCost,
    decode_step,
    prefill_seconds,
)
from tally.ledger.weights import (
    DTYPE_BYTES,
    WeightFormat,
    active_share,
    canonical_dtype,
    matmul_params,
)
from tally.models.config import ModelConfig
from tally.models.pipeline_split import plan_stages
from tally.units import fmt_gib


@dataclass(frozen=True)
class PlanOptions:
    device: Device
    dtype: str = "bfloat16"  # compute dtype
    weights: str | None = None  # dense | int8 | int4 | w8a8 | gguf; None: dense (a GGUF file: as stored)
    group_size: int = 128
    kv_dtype: str | None = None  # None: auto (kv.auto_kv_dtype)
    block_size: int = 16
    max_model_len: int | None = None  # None: the recommended length from --lengths, else the model's context
    concurrency: int | None = None  # requests the team wants in flight; None: as many as fit
    reserve: float = 0.12  # a fraction of device memory when below 1, else bytes
    tp: int = 1
    pp: int = 1
    max_batched_tokens: int = 8192  # tokens per step: sizes the parallel communication buffers
    link: Link | None = None  # between the devices of a split model; None: communication time not predicted
    percentile: float = 99.0  # share of requests the main pool serves when --lengths is given
    lengths: LengthStats | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        if self.kv_dtype is not None:
            object.__setattr__(self, "kv_dtype", canonical_kv_dtype(self.kv_dtype))


@dataclass(frozen=True)
class ModelSummary:
    name: str
    source: str
    architecture: str
    num_params: int
    matmul_params: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    tied_embeddings: bool
    max_position_embeddings: int


@dataclass(frozen=True)
class WeightSummary:
    format: str
    total_bytes: int  # the whole model
    per_device_bytes: int  # the fullest device
    gguf_tensor_types: dict[str, int]


@dataclass(frozen=True)
class KVSummary:
    dtype: str
    block_size: int
    bytes_per_token: int  # the whole model (all devices)
    bytes_per_token_per_device: int
    bytes_per_block_per_device: int
    bytes_per_request_per_device: int  # at the planned length, in whole blocks


@dataclass(frozen=True)
class PrefillEstimate:
    label: str
    prompt_tokens: int
    ttft_s: float


@dataclass(frozen=True)
class Plan:
    model: ModelSummary
    device: Device
    weights: WeightSummary
    kv: KVSummary
    memory: MemoryBudget  # per device
    split: DeviceSplit
    planned_len: int
    max_concurrency: int  # at the planned length
    concurrency: int  # what the throughput figures assume
    decode_one: DecodeEstimate
    decode_at_concurrency: DecodeEstimate
    comm_one: CommEstimate | None  # a batch-1 decode step's collectives, when the model is split and a link given
    prefill: list[PrefillEstimate]
    lengths: LengthStats | None
    long_tail: LongTailPlan | None
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out = {k: (asdict(v) if hasattr(v, "__dataclass_fields__") else v) for k, v in out.items()}
        out["prefill"] = [asdict(p) for p in self.prefill]
        out["split"]["weight_bytes"], out["split"]["comm_buffer_bytes"] = self.split.weight_bytes, self.split.comm_buffer_bytes
        for key in ("decode_one", "decode_at_concurrency"):
            out[key]["ms_per_token"] = getattr(self, key).ms_per_token
        if self.lengths is not None:
            s = self.lengths
            out["lengths"] = {"num_requests": s.num_requests, "prompt_tokens": s.prompt_tokens,
                              "output_tokens": s.output_tokens, "total_tokens": s.total_tokens,
                              "mean_total_tokens": s.mean_total_tokens}
        return out


def make_plan(source: ModelSource, opts: PlanOptions) -> Plan:
    config = source.config
    plan_stages(config, opts.pp)  # refuses more stages than layers, as the engine does
    fmt = WeightFormat(opts.weights or source.default_weights, opts.dtype, opts.group_size)
    kv_dtype = opts.kv_dtype or auto_kv_dtype(opts.dtype, fmt.scheme != "dense")
    layout = KVLayout.for_model(config, kv_dtype=kv_dtype, block_size=opts.block_size, tp_size=opts.tp, pp_size=opts.pp)
    split = split_model(source.tensors, fmt, config, tp=opts.tp, pp=opts.pp, max_batched_tokens=opts.max_batched_tokens,
                        activation_bytes=DTYPE_BYTES[fmt.dtype], nccl=opts.link is None or opts.link.backend == "nccl")
    device = opts.device
    reserve_bytes = int(opts.reserve * device.memory_bytes) if opts.reserve < 1 else int(opts.reserve)
    budget = memory_budget(layout, device_bytes=device.memory_bytes, weight_bytes=split.weight_bytes,
                           reserve_bytes=reserve_bytes, comm_buffer_bytes=split.comm_buffer_bytes)
    long_tail = None
    if opts.lengths is not None:
        long_tail = long_tail_plan(layout, budget.kv_blocks, opts.lengths, percentile=opts.percentile,
                                   theoretical_max_len=opts.max_model_len or config.max_position_embeddings,
                                   main_concurrency=opts.concurrency)
    planned_len = opts.max_model_len or (long_tail.max_model_len if long_tail else config.max_position_embeddings)
    fits = max_concurrency(layout, budget.kv_blocks, planned_len)
    concurrency = opts.concurrency or max(fits, 1)

    cost = _per_device_cost(source, opts, fmt, split, kv_dtype)
    # Decode reads each request's whole context: the workload's average when known, else the planned length.
    context = round(opts.lengths.mean_decode_context_tokens) if opts.lengths else planned_len
    rates = dict(bandwidth_bytes_per_s=device.bandwidth_bytes_per_s, flops_per_s=device.flops_per_s)
    prompts = ([("p50 prompt", opts.lengths.prompt_tokens["p50"]), ("p99 prompt", opts.lengths.prompt_tokens["p99"])]
               if opts.lengths else [(f"{planned_len:,}-token prompt", planned_len)])
    whole_model_kv = KVLayout.for_model(config, kv_dtype=kv_dtype, block_size=opts.block_size)
    comm = {c: _decode_comm(config, opts, c, DTYPE_BYTES[fmt.dtype]) for c in (1, concurrency)}
    return Plan(
        model=_model_summary(source),
        device=device,
        weights=WeightSummary(fmt.label, sum(fmt.tensor_bytes(t) for t in source.tensors), split.weight_bytes,
                              dict(source.gguf_tensor_types)),
        kv=KVSummary(layout.kv_dtype, layout.block_size, whole_model_kv.bytes_per_token, layout.bytes_per_token,
                     layout.bytes_per_block, layout.bytes_for_tokens(planned_len)),
        memory=budget,
        split=split,
        planned_len=planned_len,
        max_concurrency=fits,
        concurrency=concurrency,
        decode_one=decode_step(cost, concurrency=1, context_tokens=context, comm_s=_seconds(comm[1]), **rates),
        decode_at_concurrency=decode_step(cost, concurrency=concurrency, context_tokens=context,
                                          comm_s=_seconds(comm[concurrency]), **rates),
        comm_one=comm[1],
        prefill=[PrefillEstimate(label, n, prefill_seconds(cost, prompt_tokens=n, **rates)) for label, n in prompts],
        lengths=opts.lengths,
        long_tail=long_tail,
        warnings=_warnings(source, opts, layout, budget, planned_len, fits, long_tail),
    )


def _decode_comm(config: ModelConfig, opts: PlanOptions, concurrency: int,
                 activation_bytes: int) -> CommEstimate | None:
    if opts.link is None or opts.tp * opts.pp == 1:
        return None
    return step_comm(config, tp=opts.tp, pp=opts.pp, tokens=concurrency, logit_rows=concurrency,
                     activation_bytes=activation_bytes, link=opts.link)


def _seconds(comm: CommEstimate | None) -> float:
    return comm.seconds if comm is not None else 0.0


def _model_summary(source: ModelSource) -> ModelSummary:
    c, tensors = source.config, source.tensors
    return ModelSummary(source.name, source.kind, c.architecture, sum(t.numel for t in tensors),
                        matmul_params(tensors, c), c.num_layers, c.num_heads, c.num_kv_heads,
                        c.head_dim, c.hidden_size, c.vocab_size, c.tie_word_embeddings, c.max_position_embeddings)


def _per_device_cost(source: ModelSource, opts: PlanOptions, fmt: WeightFormat, split: DeviceSplit,
                     kv_dtype: str) -> ModelCost:
    """What one TP rank reads and computes per token; a token walks through every PP stage in turn,
    so stages add up (communication is added by tally/ledger/comm.py)."""
    config = source.config
    # a decode token reads the experts it is routed to, not all of them
    unread = sum(fmt.tensor_bytes(t) * (1 - active_share(t, config)) for t in source.tensors)
    return ModelCost(
        weight_bytes=split.weight_bytes * opts.pp - int(unread) // opts.tp,
        matmul_params=matmul_params(source.tensors, config) // opts.tp,
        attention_width=config.num_layers * -(-config.num_heads // opts.tp) * config.head_dim,
        kv_bytes_per_token=KVLayout.for_model(config, kv_dtype=kv_dtype, block_size=opts.block_size,
                                              tp_size=opts.tp).bytes_per_token,
    )


def _warnings(source: ModelSource, opts: PlanOptions, layout: KVLayout, budget: MemoryBudget, planned_len: int,
              fits: int, long_tail: LongTailPlan | None) -> list[str]:
    out = []
    context = source.config.max_position_embeddings
    if planned_len > context:
        out.append(f"the planned length {planned_len:,} exceeds the model's context of {context:,} tokens")
    if fits < 1:
        out.append(f"weights ({fmt_gib(budget.weight_bytes)}) + reserve ({fmt_gib(budget.reserve_bytes)}) + buffers "
                   f"leave {fmt_gib(max(budget.kv_pool_bytes, 0))} for KV, not enough for one {planned_len:,}-token "
                   f"request ({fmt_gib(layout.bytes_for_tokens(planned_len))}); quantize the weights, shorten "
                   "--max-model-len, or split the model with -tp / -pp")
    elif opts.concurrency:
        warning = oversubscription_warning(layout, budget, concurrency=opts.concurrency, max_len=planned_len)
        if warning:
            out.append(warning)
    if long_tail and long_tail.tail_max_len > context:
        out.append(f"the longest request in the trace ({long_tail.tail_max_len:,} tokens) exceeds the model's "
                   f"context of {context:,}: the long-tail pool cannot serve it")
    return out
