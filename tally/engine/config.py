"""Engine configuration: vLLM's names, validated once at the edge (LLM(), CLI, server)."""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from tally.attention.backend import BACKEND_NAMES
from tally.core.scheduler import SCHEDULING_POLICIES, SchedulerConfig
from tally.engine.grammar_limits import GrammarLimits
from tally.engine.lora_manager import parse_lora_modules
from tally.engine.pooling import CONVERTS, POOLING_TYPES, RUNNERS, TASKS, parse_pooler_config, serving_runner
from tally.engine.speculation.config import SpeculativeConfig
from tally.errors import ConfigError
from tally.flags import (
    BLOCK_SIZE,
    DTYPE,
    ENGINE_KV_CACHE_DTYPES,
    KV_CACHE_DTYPE,
    KV_CACHE_MEMORY,
    MAX_MODEL_LEN,
    MAX_NUM_BATCHED_TOKENS,
    MAX_NUM_SEQS,
    MODEL,
    PIPELINE_PARALLEL_SIZE,
    QUANTIZATION,
    QUANTIZATIONS,
    SWAP_SPACE,
    TENSOR_PARALLEL_SIZE,
    THREADS,
    Flag,
)
from tally.layers.linear import fp16_weights_supported
from tally.models.sentence_transformers import CheckpointPooling
from tally.models.generation_config import generation_overrides
from tally.native import ops as native
from tally.platform import has_fast_bf16, parse_cpu_list
from tally.progress import Track, on_stderr, untracked
from tally.sampling_params import MAX_LOGPROBS

DTYPES = {"float32": torch.float32, "float": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16}  # "float" and "half" (below) are vLLM's spellings
# fp16 weights with fp32 compute (tally/layers/dense.py Fp16WeightLinear): never fp16 arithmetic on CPU
FP16_WEIGHT_NAMES = ("float16", "half", "fp16")
SCHEDULINGS = ("continuous", "static")
PREEMPTION_MODES = ("auto", "swap", "recompute")  # vLLM's swap and recompute; auto: measured per preemption
SWAP_SPACE_DTYPES = ("auto", "int8")
_CANONICAL = {torch.float32: "float32", torch.bfloat16: "bfloat16"}


@dataclass(frozen=True)
class PathCandidate:
    """A way to run the model's projections: `dtype` float32 | bfloat16 | float16 (fp16 weights under fp32
    compute) and the quantization the builder gets. `panels`: float32's or bfloat16's dense weights on the native
    kernel's panels, whose sums are row-independent, not on PyTorch's BLAS or oneDNN (tally/layers/dense.py
    Fp32PanelLinear, Bf16PanelLinear)."""
    dtype: str
    quantization: str | None
    panels: bool = False

    @property
    def dtypes(self) -> tuple[torch.dtype, torch.dtype | None]:
        """(compute dtype, weight dtype of dense projections, None: the compute dtype), as build_model takes."""
        if self.dtype == "float16":
            return torch.float32, torch.float16
        return DTYPES[self.dtype], DTYPES[self.dtype] if self.panels else None

    @property
    def label(self) -> str:
        compute = {"float16": "fp32 compute, fp16 dense", "float32": "fp32", "bfloat16": "bf16"}[self.dtype]
        return f"{self.quantization or 'dense'}, {compute}{' panels' if self.panels else ''}"


def option(default: Any, help: str, *, choices: tuple[str, ...] | None = None, aliases: tuple[str, ...] = (),
           parse: Callable[[str], Any] | None = None, nargs: str | None = None) -> Any:
    """A field of EngineConfig and, from the same line, its command-line flag (tally/engine/args.py)."""
    return field(default=default, metadata={"help": help, "choices": choices, "aliases": aliases, "parse": parse,
                                            "nargs": nargs})


def shared(flag: Flag) -> Any:
    """A field whose flag other verbs take too (tally plan's --kv-cache-dtype): defined once in tally/flags.py."""
    return field(default=flag.default, metadata={"flag": flag})


@dataclass(frozen=True)
class EngineConfig:
    """Every engine option, with vLLM's names; `tally serve` and `tally generate` flags are made from these fields
    (`--max-num-seqs` for max_num_seqs), and `LLM(**kwargs)` takes the same names."""

    model: str | None = shared(MODEL)
    dtype: str = shared(DTYPE)
    quantization: str | None = shared(QUANTIZATION)
    max_model_len: int | None = shared(MAX_MODEL_LEN)
    max_num_seqs: int = shared(MAX_NUM_SEQS)
    max_num_batched_tokens: int = shared(MAX_NUM_BATCHED_TOKENS)
    max_num_partial_prefills: int = option(SchedulerConfig.max_num_partial_prefills,
                                           "prompts whose prefill is split across steps, at once")
    enable_chunked_prefill: bool = option(SchedulerConfig.enable_chunked_prefill,
                                          "split long prompts across steps beside running decodes")
    enable_prefix_caching: bool = option(True, "reuse the KV blocks of a prompt prefix seen before")
    block_size: int = shared(BLOCK_SIZE)
    kv_cache_dtype: str = shared(KV_CACHE_DTYPE)
    kv_cache_memory: int | None = shared(KV_CACHE_MEMORY)
    num_gpu_blocks_override: int | None = option(None, "KV blocks in the pool, whatever the memory budget says "
                                                       "(vLLM's name; for tests of preemption)")
    kv_cache_memory_fraction: float = option(0.25, "share of free RAM the default KV pool may take")
    swap_space: float = shared(SWAP_SPACE)
    preemption_mode: str = option("auto", "auto: a preempted request's blocks go to the swap space when copying them "
                                          "out and back is measured cheaper than recomputing them; swap / recompute: "
                                          "always that", choices=PREEMPTION_MODES)
    swap_space_dtype: str = option("auto", "auto: blocks swapped as the pool holds them (exact); int8: a float pool's "
                                           "blocks swapped in int8 (2-4x more fit, but lossy: a swapped request's "
                                           "output may change)", choices=SWAP_SPACE_DTYPES)
    kv_disk_cache_dir: str | None = option(None, "folder of a second prefix cache on disk: full KV blocks by their "
                                                 "tokens, read back on a prefix-cache miss, also after a restart (a "
                                                 "sub-folder per model and settings; servers may share it)")
    kv_disk_cache_size: float = option(10.0, "GiB the disk prefix cache may take in its folder; the least recently "
                                             "used blocks go first")
    scheduling: str = option("continuous", "static exists only to show what continuous batching buys",
                             choices=SCHEDULINGS)
    scheduling_policy: str = option("fcfs", "fcfs: the queue is admitted in arrival order; priority: by each request's "
                                            "priority field, lower first (vLLM's), and under memory pressure the "
                                            "lowest is preempted first", choices=SCHEDULING_POLICIES)
    batch_invariant: bool = option(True, "a request's logits are bitwise the same whatever runs beside it "
                                         "(docs/server.md#reproducibility); off: fp32 projections run on PyTorch's "
                                         "BLAS, tensor parallel all-reduces partial sums (docs/parallel.md) and, "
                                         "where the CPU has AVX-512 BF16 or AMX, start-up may also measure bf16 "
                                         "paths, whose sums depend on the batch")
    attention_backend: str = option("auto", "auto: the reference kernel for plain causal prefills, tiled for "
                                            "masked ones", choices=BACKEND_NAMES)
    max_itl_s: float | None = option(None, "seconds: while streams decode, a prompt runs a slice of its layers a "
                                           "step beside them, as many as fit in this inter-token latency (by the "
                                           "measured cost), so a long prompt cannot freeze them (tally serve: 0.3; "
                                           "none: no target)",
                                     aliases=("--max-itl",))
    step_log: str | None = option(None, "file: one JSON line per engine step (its start and seconds, prompt tokens, "
                                        "decode rows, token budget, the step cost fit's prediction, proposals "
                                        "verified), to find where a stream's long gap came from "
                                        "(benchmarks/itl_under_trace.py --attribute)")
    num_scheduler_steps: int = option(1, "decode steps run in one call where a step holds only greedy decodes "
                                         "(vLLM's name): the interpreter's per-step work is paid once a burst, and "
                                         "streams get their tokens in bursts (LLM(): 8, nobody streams there)")
    speculative_config: str | dict | None = option(
        None, "speculative decoding, vLLM's JSON form, e.g. '{\"method\": \"ngram\", \"num_speculative_tokens\": 4}' "
              "(prompt_lookup_min / _max: the n-gram sizes; \"adaptive\": false fixes how many are verified), or "
              "'{\"method\": \"draft_model\", \"model\": PATH, \"num_speculative_tokens\": 3}' (a smaller model "
              "with the same tokenizer)")
    structured_outputs_config: str | dict | None = option(
        None, "bounds on compiling a request's JSON schema, regex, choice or grammar, vLLM's flag as JSON, e.g. "
              f"'{{\"max_properties\": 10000, \"compile_timeout_s\": 60}}'; keys and defaults: max_bytes "
              f"{GrammarLimits.max_bytes}, max_properties {GrammarLimits.max_properties}, max_choices "
              f"{GrammarLimits.max_choices} (a choice's strings, a schema's enum values), compile_timeout_s "
              f"{GrammarLimits.compile_timeout_s:g}, cache_size {GrammarLimits.cache_size} (compiled grammars kept)")
    generation_config: str = option("auto", "auto: the checkpoint's generation_config.json sets the default "
                                            "temperature / top_p / top_k / min_p / repetition_penalty, and "
                                            "max_new_tokens the default max_tokens, of requests that do not set "
                                            "them (vLLM's default; the built-in model's: max_new_tokens 512); "
                                            "vllm: none (max_tokens unset runs to the end of the context); or a "
                                            "folder")
    override_generation_config: str | dict | None = option(
        None, "JSON over the generation config (vLLM's), e.g. '{\"max_new_tokens\": 256}': the max_tokens of "
              "requests that leave it unset (default: the checkpoint's max_new_tokens; 512 for the built-in model; "
              "else up to the end of the context); also temperature, top_p, top_k, min_p, repetition_penalty")
    max_logprobs: int = option(MAX_LOGPROBS, "the most logprobs (or prompt_logprobs) a request may ask for; each "
                                             "costs a top-k over the vocabulary per token")
    threads: int | None = shared(THREADS)
    cpu_affinity: str | None = option(None, "CPUs the engine may run on, e.g. 0-3 (taskset's list format): keeps "
                                            "it off the cores a neighbour uses; threads default to its cores")
    tensor_parallel_size: int = shared(TENSOR_PARALLEL_SIZE)
    pipeline_parallel_size: int = shared(PIPELINE_PARALLEL_SIZE)
    seed: int = option(0, "seed of the engine's shared sampling generator")
    disable_log_stats: bool = option(False, "no periodic throughput / queue / KV line in the server log "
                                            "(vLLM's flag)")
    use_tqdm_on_load: bool = option(True, "a progress bar on stderr while the weights load (a line per "
                                          "tenth of the way where stderr is not a terminal); vLLM's flag")
    runner: str = option("auto", "generate: text (completions, chat, messages, responses); pooling: embeddings "
                                 "(/v1/embeddings, /v1/score, /v1/rerank, LLM.embed / LLM.score); auto: pooling for a "
                                 "sentence-transformers checkpoint (modules.json) or an encoder (BERT, XLM-R), else "
                                 "generate (vLLM's flag)",
                         choices=RUNNERS)
    convert: str = option("auto", "embed: serve a generative checkpoint as an embedding model (vLLM's flag; the same "
                                  "as --runner pooling)", choices=CONVERTS)
    task: str = option("auto", "vLLM's older spelling: embed (or score) is --runner pooling, generate --runner "
                               "generate; a cross-encoder (*ForSequenceClassification) serves score",
                       choices=TASKS)
    pooler_config: str | dict | None = option(
        None, "how embeddings are pooled, vLLM's JSON, e.g. '{\"pooling_type\": \"MEAN\", \"normalize\": true}' "
              f"(pooling_type one of {', '.join(POOLING_TYPES)}; also is_matryoshka and matryoshka_dimensions, which "
              "allow a request's dimensions); default: the checkpoint's sentence-transformers modules, else LAST "
              "(CLS for an encoder), normalized", aliases=("--override-pooler-config",))
    served_model_name: str | list[str] | None = option(
        None, "the name(s) the API answers to; the first is reported (default: the checkpoint's)", nargs="+")
    enable_lora: bool = option(False, "serve LoRA adapters: a request picks one by its model name (vLLM's flag)")
    lora_modules: str | list[str] | None = option(
        None, "adapters served from the start, name=path (a PEFT folder or a GGUF LoRA file) or vLLM's JSON "
              "'{\"name\": \"sql\", \"path\": \"/adapters/sql\", \"base_model_name\": ...}'; needs --enable-lora",
        nargs="+")
    max_loras: int = option(1, "different adapters one step may run (more wait for a place); vLLM's flag")
    max_lora_rank: int = option(16, "the largest adapter rank (r) served; a larger adapter is refused at load")
    max_cpu_loras: int | None = option(None, "adapters held in memory at once, the least recently used read again "
                                             "from disk when asked (default: max_loras)")

    @property
    def served_model_names(self) -> tuple[str, ...]:
        """The names the API answers to, the reported one first; () for the checkpoint's own."""
        names = self.served_model_name
        return () if names is None else (names,) if isinstance(names, str) else tuple(names)

    @property
    def world_size(self) -> int:
        """Processes of a parallel engine: tensor_parallel_size x pipeline_parallel_size."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def speculative(self) -> SpeculativeConfig | None:
        return SpeculativeConfig.parse(self.speculative_config)

    @property
    def grammar_limits(self) -> GrammarLimits:
        return GrammarLimits.parse(self.structured_outputs_config)

    def __post_init__(self) -> None:
        self.speculative  # refuses a bad speculative_config at start, with what to fix
        generation_overrides(self.override_generation_config)  # and a bad override_generation_config
        self.grammar_limits
        parse_pooler_config(self.pooler_config)  # and a bad pooler_config
        for name, allowed in (("runner", RUNNERS), ("convert", CONVERTS), ("task", TASKS)):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}", param=name)
        if serving_runner(self.runner, self.convert, self.task, CheckpointPooling()) == "pooling" \
                and self.pipeline_parallel_size > 1:  # the hidden states stay on the last stage
            raise ConfigError("embeddings do not run under pipeline parallelism; use tensor_parallel_size",
                              param="pipeline_parallel_size")
        if self.served_model_name is not None and not all(self.served_model_names):
            raise ConfigError("served_model_name needs non-empty names")
        if self.dtype not in ("auto", *DTYPES, *FP16_WEIGHT_NAMES):
            raise ConfigError(f"dtype {self.dtype!r} is not supported; use auto, float32, bfloat16 or float16")
        if self.dtype in FP16_WEIGHT_NAMES:
            if not fp16_weights_supported():
                raise ConfigError("dtype float16 stores weights in fp16 for FBGEMM's fp16 GEMM, which this torch "
                                  "build lacks; use float32 or bfloat16")
        if self.quantization not in (None, "none", *QUANTIZATIONS):
            raise ConfigError(f"quantization {self.quantization!r} unknown; use one of {', '.join(QUANTIZATIONS)}")
        if self.kv_cache_dtype not in ENGINE_KV_CACHE_DTYPES:
            raise ConfigError(f"kv_cache_dtype {self.kv_cache_dtype!r} is not one this CPU engine stores; use one of "
                              f"{', '.join(ENGINE_KV_CACHE_DTYPES)}", param="kv_cache_dtype")
        if self.scheduling not in SCHEDULINGS:
            raise ConfigError(f"scheduling must be one of {SCHEDULINGS}, got {self.scheduling!r}")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ConfigError(f"scheduling_policy must be one of {SCHEDULING_POLICIES}, got {self.scheduling_policy!r}",
                              param="scheduling_policy")
        if self.attention_backend not in BACKEND_NAMES:
            raise ConfigError(f"attention_backend {self.attention_backend!r} unknown; use one of {BACKEND_NAMES}")
        if self.num_gpu_blocks_override is not None and self.num_gpu_blocks_override < 1:
            raise ConfigError(f"num_gpu_blocks_override must be ≥ 1, got {self.num_gpu_blocks_override}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "max_num_partial_prefills",
                     "num_scheduler_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        if self.cpu_affinity is not None:
            try:
                cpus = parse_cpu_list(self.cpu_affinity)
            except ValueError as exc:
                raise ConfigError(str(exc), param="cpu_affinity") from exc
            if not cpus <= set(range(os.cpu_count() or 1)):
                raise ConfigError(f"cpu_affinity {self.cpu_affinity!r} names CPUs this machine lacks (it has "
                                  f"0-{(os.cpu_count() or 1) - 1})", param="cpu_affinity")
        for name in ("tensor_parallel_size", "pipeline_parallel_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be ≥ 1, got {getattr(self, name)}", param=name)
        if self.pipeline_parallel_size > 1 and self.kv_cache_dtype == "int8":
            # its key scales are measured by one prefill through the whole model (tally/models/key_smoothing.py)
            raise ConfigError("kv_cache_dtype int8 does not run under pipeline parallelism yet; use auto, float32, "
                              "float16 or bfloat16, or split the model with tensor_parallel_size",
                              param="kv_cache_dtype")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"threads must be ≥ 1, got {self.threads}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ConfigError(f"max_model_len must be ≥ 1, got {self.max_model_len}")
        if self.max_itl_s is not None and not self.max_itl_s > 0:
            raise ConfigError(f"max_itl_s must be > 0 seconds, got {self.max_itl_s}")
        if not 0 < self.kv_cache_memory_fraction <= 0.9:
            raise ConfigError("kv_cache_memory_fraction must be in (0, 0.9]")
        self._check_kv_tiers()
        self._check_lora()

    def _check_lora(self) -> None:
        if not self.enable_lora:
            if self.lora_modules:
                raise ConfigError("lora_modules needs enable_lora (--enable-lora)", param="enable_lora")
            return
        parse_lora_modules(self.lora_modules)  # refuses a malformed item at start
        for name in ("max_loras", "max_lora_rank"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be ≥ 1, got {getattr(self, name)}", param=name)
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ConfigError(f"max_cpu_loras ({self.max_cpu_loras}) must be ≥ max_loras ({self.max_loras}): a step's "
                              "adapters are all in memory", param="max_cpu_loras")
        if self.speculative_config is not None:  # a draft or n-gram proposal knows nothing of the adapter
            raise ConfigError("speculative decoding does not run with LoRA adapters; drop --speculative-config or "
                              "--enable-lora", param="speculative_config")
        if self.world_size > 1:
            raise ConfigError("LoRA adapters do not run under tensor / pipeline parallelism yet; serve them on one "
                              "process", param="enable_lora")

    def _check_kv_tiers(self) -> None:
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ConfigError(f"preemption_mode must be one of {PREEMPTION_MODES}, got {self.preemption_mode!r}")
        if self.swap_space_dtype not in SWAP_SPACE_DTYPES:
            raise ConfigError(f"swap_space_dtype must be one of {SWAP_SPACE_DTYPES}, got {self.swap_space_dtype!r}")
        if not self.swap_space >= 0:
            raise ConfigError(f"swap_space must be ≥ 0 GiB, got {self.swap_space}", param="swap_space")
        if not self.kv_disk_cache_size > 0:
            raise ConfigError(f"kv_disk_cache_size must be > 0 GiB, got {self.kv_disk_cache_size}",
                              param="kv_disk_cache_size")
        if self.preemption_mode == "swap" and self.swap_space == 0:
            raise ConfigError("preemption_mode swap needs a swap space: set swap_space > 0 GiB", param="swap_space")
        if self.kv_disk_cache_dir is not None and not self.enable_prefix_caching:
            raise ConfigError("kv_disk_cache_dir is a second prefix cache: it needs enable_prefix_caching",
                              param="kv_disk_cache_dir")
        if self.world_size > 1 and (self.kv_disk_cache_dir is not None or self.preemption_mode == "swap"):
            # each rank's KV slice lives in its own process; the tiers move rank 0's only
            raise ConfigError("the swap space and the disk prefix cache do not run under tensor / pipeline "
                              "parallelism yet; leave preemption_mode and kv_disk_cache_dir unset",
                              param="kv_disk_cache_dir" if self.kv_disk_cache_dir is not None else "preemption_mode")

    def load_progress(self, rank: int = 0) -> Track:
        """How reading the checkpoint shows its progress: on rank 0 only, as vLLM, unless use_tqdm_on_load is off."""
        return on_stderr if self.use_tqdm_on_load and rank == 0 else untracked

    def served_quantization(self, is_gguf: bool) -> str | None:
        """What the builder gets: a GGUF file's blocks as stored (as llama.cpp and vLLM's GGUF loader serve them;
        dequantizing a 4-bit file to 16 bits takes ~3.5x the memory), unless quantization="none" asks for the
        file dequantized."""
        if self.quantization is None and is_gguf:
            return "gguf"
        return None if self.quantization == "none" else self.quantization

    def path_candidates(self, checkpoint_dtype: str, is_gguf: bool,
                        prequantized: bool) -> tuple[list[PathCandidate], bool]:
        """(the paths start-up may choose between, whether measuring may choose at all): tally/engine/
        path_tuning.py times them, and may send many-row steps of an fp32-compute path to bf16. An explicit
        dtype wins, unmeasured (float32 and bfloat16 dense weights on the native panels under batch_invariant).
        fp32 checkpoints stay fp32, unmeasured: the exact path (on the native panels under
        batch_invariant: docs/benchmarks.md#kernels gives their cost). Half-precision and GGUF
        checkpoints: fp32 compute over fp16 weights (Tally's native kernels, the one-call decode step), and bf16
        compute where the CPU has bf16 instructions (elsewhere PyTorch emulates bf16 10-20x slower than fp32: not
        worth the time to measure), unless batch_invariant holds them to the fp32 path. Pre-quantized checkpoints keep
        one path (bf16 where fast and batch_invariant is off): their layers' shapes are not described to the
        measurement yet."""
        q = self.served_quantization(is_gguf)
        # fp32 on PyTorch's BLAS (and bf16 on oneDNN) sums in an order that follows the row count; the native panels'
        # does not
        panels = self.batch_invariant and native.available()
        fp32 = PathCandidate("float32", q, panels=panels)
        if self.dtype != "auto":
            name = "float16" if self.dtype in FP16_WEIGHT_NAMES else _CANONICAL[DTYPES[self.dtype]]
            return [PathCandidate(name, q, panels=panels and name != "float16")], False
        if not (is_gguf or checkpoint_dtype in ("bfloat16", "float16")):
            return [fp32], False
        fp32_compute = PathCandidate("float16", q) if fp16_weights_supported() else fp32
        if not has_fast_bf16():
            return [fp32_compute], not prequantized
        if self.batch_invariant:  # oneDNN's bf16 matmul sums in an order that depends on the row count
            return [fp32_compute], False
        bf16 = PathCandidate("bfloat16", q)
        return ([bf16], False) if prequantized else ([fp32_compute, bf16], True)
