"""A pod's memory from the ledger: weights + a KV pool of `concurrency` requests at max_model_len + the swap space
preempted requests' blocks may wait in + a reserve.

The figures come from `tally plan`'s own make_plan, so the pod asks for what the plan prints; the pod's server is
then started with the same dtype, max_model_len and `--kv-cache-memory` (the KV pool in bytes), so the engine
allocates what was asked for instead of sizing its pool from the node's free RAM."""
from __future__ import annotations

from dataclasses import dataclass

from tally.deploy.k8s_config import K8sConfig
from tally.errors import ConfigError
from tally.flags import SWAP_SPACE
from tally.ledger.kv import auto_kv_dtype
from tally.ledger.model_source import ModelSource
from tally.ledger.model_source import resolve_model as resolve_ledger_model
from tally.ledger.plan import PlanOptions, make_plan
from tally.ledger.presets import Device
from tally.models.registry import ALIASES
from tally.models.registry import resolve_model as resolve_packaged_model
from tally.units import GiB, fmt_gb, fmt_gib

MODEL_MOUNT = "/models"
# make_plan's per-device bytes (weights, KV per request, a reserve given in bytes) do not depend on the device;
# its speeds and "how many fit" do, and are not read here.
POD_DEVICE = Device("kubernetes pod", memory_bytes=0, bandwidth_bytes_per_s=1.0, flops_per_s=1.0)

# The engine's auto KV cache takes the dtype it computes in (fp16 over quantized weights: auto_kv_dtype); `--dtype
# float16` is fp16 weights with fp32 arithmetic (tally/engine/config.py), so their cache is fp32 although the weights
# are priced at 2 bytes.
COMPUTE_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float32"}


@dataclass(frozen=True)
class PodSizing:
    model_arg: str  # what the pod's `tally serve --model` loads
    model_name: str  # the ledger's name for the model it sized
    dtype: str
    max_model_len: int
    concurrency: int
    weight_bytes: int
    kv_pool_bytes: int
    reserve_bytes: int
    swap_space_gib: float  # tally serve --swap-space: RAM where preempted requests' blocks wait

    @property
    def swap_space_bytes(self) -> int:
        return int(self.swap_space_gib * GiB)  # as the engine reads the flag (tally/engine/kv_tiers/tiers.py)

    @property
    def memory_bytes(self) -> int:
        return self.weight_bytes + self.kv_pool_bytes + self.swap_space_bytes + self.reserve_bytes

    def summary(self) -> str:
        return (f"{self.model_name}: weights {fmt_gb(self.weight_bytes)} + KV {fmt_gib(self.kv_pool_bytes)} "
                f"({self.concurrency} x {self.max_model_len:,} tokens, {self.dtype}) + swap space "
                f"{fmt_gib(self.swap_space_bytes)} + reserve {fmt_gib(self.reserve_bytes)} = "
                f"{fmt_gib(self.memory_bytes)} ({self.memory_bytes:,} bytes) per pod")


def size_pod(config: K8sConfig) -> PodSizing:
    source, model_arg = _model(config)
    dtype = config.dtype or _default_dtype(source)
    context = source.config.max_position_embeddings
    max_model_len = config.max_model_len or context
    if max_model_len > context:  # tally serve would refuse to start; say so now
        raise ConfigError(f"--max-model-len {max_model_len:,} exceeds the context of {source.name} "
                          f"({context:,} tokens); use --max-model-len ≤ {context}")
    plan = make_plan(source, PlanOptions(
        device=POD_DEVICE, dtype=dtype,
        kv_dtype=(auto_kv_dtype(COMPUTE_DTYPES[dtype], source.default_weights != "dense")
                  if config.kv_cache_dtype == "auto" else config.kv_cache_dtype),
        max_model_len=max_model_len, concurrency=config.concurrency, reserve=float(config.reserve_bytes)))
    kv_pool_bytes = plan.concurrency * plan.kv.bytes_per_request_per_device
    # A pool's worth of preempted blocks may wait; serve's default (4 GiB) would outweigh a small model's pod.
    swap = config.swap_space_gib if config.swap_space_gib is not None else min(SWAP_SPACE.default,
                                                                                   kv_pool_bytes / GiB)
    return PodSizing(
        model_arg=model_arg, model_name=source.name, dtype=dtype, max_model_len=max_model_len,
        concurrency=plan.concurrency, weight_bytes=plan.memory.weight_bytes, kv_pool_bytes=kv_pool_bytes,
        reserve_bytes=plan.memory.reserve_bytes, swap_space_gib=swap)


def _default_dtype(source: ModelSource) -> str:
    """What `tally serve --dtype auto` serves on any AVX2 CPU, fixed so the request can be sized: fp32 arithmetic,
    over a GGUF file's blocks or fp16 copies of half-precision weights (the native kernels' paths); fp32 checkpoints
    as they are. bf16 arithmetic is fast only on CPUs with bf16 instructions: --dtype bfloat16 where nodes have them."""
    return "float32" if source.is_gguf or source.config.torch_dtype == "float32" else "float16"


def _model(config: K8sConfig) -> tuple[ModelSource, str]:
    """The model to size, and the path the pod loads it from: the image's own for the built-in alias (sized from
    the same package file, installed here), else the claim mounted at /models."""
    if config.model.lower() in ALIASES:
        return resolve_ledger_model(str(resolve_packaged_model(config.model).path)), config.model.lower()
    source = resolve_ledger_model(config.model)
    if config.model_pvc is None:
        raise ConfigError(f"--model {config.model!r} is not in the image: copy it to a PersistentVolumeClaim as "
                          f"{source.name} and give --model-pvc CLAIM (mounted at {MODEL_MOUNT}; the pods load "
                          f"{MODEL_MOUNT}/{source.name})")
    return source, f"{MODEL_MOUNT}/{source.name}"
