"""Command-line options that several verbs take, each defined once: `--dtype bfloat16`, `--kv-cache-dtype int8`,
`--max-num-batched-tokens 2048` or `--out PATH` mean the same whichever verb reads them, with the same choices,
and every verb's `--help` shows each option's default the same way (HelpFormatter). Torch-free, so that `tally plan`
and `tally bench` run without it; the engine's options that only serve, generate and tune take are EngineConfig's
fields (tally/engine/config.py), which take the shared ones from here."""
from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tally.metric_names import METRICS_PREFIXES
from tally.units import parse_bytes

DTYPES = ("auto", "float32", "bfloat16", "float16")
# vLLM's spellings (float, half) and the short ones read as the names above, before argparse checks the choices
DTYPE_ALIASES = {"float": "float32", "fp32": "float32", "bf16": "bfloat16", "half": "float16", "fp16": "float16"}
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16", "int8", "fp8")
KV_CACHE_DTYPE_ALIASES = {**DTYPE_ALIASES, "float8": "fp8", "fp8_e4m3": "fp8", "float8_e4m3fn": "fp8"}
# What the CPU engine stores; float16 and fp8 are there for `tally plan` on GPU devices
ENGINE_KV_CACHE_DTYPES = ("auto", "float32", "float16", "bfloat16", "int8")
QUANTIZATIONS = ("int8", "int4", "w8a8", "gguf")  # gguf: a GGUF file's blocks as stored
LOG_LEVELS = ("debug", "info", "warning", "error")


def canonical(aliases: dict[str, str]) -> Callable[[str], str]:
    """An argparse type that reads an alias as its name (`half` → float16); unknown text fails the choices."""
    def name(text: str) -> str:
        key = text.strip().lower()
        return aliases.get(key, key)
    return name


@dataclass(frozen=True)
class Flag:
    """One option as every verb that takes it spells it: `--kv-cache-dtype` for dest kv_cache_dtype."""
    dest: str
    help: str
    default: Any = None
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    aliases: tuple[str, ...] = ()  # other spellings, shown first (-tp)
    nargs: str | None = None
    metavar: str | None = None
    action: str | type[argparse.Action] | None = None  # "store_true", or BooleanOptionalAction (--x / --no-x)
    none_means: str | None = None  # what leaving it out does, where the default is None ("the model's context")

    @property
    def option_strings(self) -> list[str]:
        return [*self.aliases, "--" + self.dest.replace("_", "-")]

    def add(self, parser: argparse.ArgumentParser | argparse._ArgumentGroup, *, prefix: str = "",
            default: Any = ..., note: str = "", required: bool = False) -> argparse.Action:
        """Adds the option to a verb's parser. `prefix` makes one per model (eval's --candidate-kv-cache-dtype);
        `default` is a verb's own default, `note` what the option does in that verb beyond the shared help."""
        names = [f"--{prefix}-{self.dest.replace('_', '-')}"] if prefix else self.option_strings
        default = self.default if default is ... else default
        unset = f" (default: {self.none_means})" if default is None and self.none_means else ""
        kwargs: dict[str, Any] = {"dest": f"{prefix.replace('-', '_')}_{self.dest}" if prefix else self.dest,
                                  "default": default, "help": self.help + note + unset, "required": required}
        if self.action is not None:
            kwargs["action"] = self.action
        else:
            kwargs.update(type=self.type, choices=self.choices, nargs=self.nargs, metavar=self.metavar)
        action = parser.add_argument(*names, **kwargs)
        action.flag = self  # tests/test_cli_flags_agree.py: every verb's copy comes from here
        return action


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every verb's: each option's help ends with its default, except where there is no value to show (a switch
    that is off, or None, whose meaning the help states) or the help states it in words."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "%(default)" in text or "(default" in text or default is None or default is False or default == [] \
                or default is argparse.SUPPRESS:
            return text
        return text + " (default: %(default)s)"


def parser(prog: str, description: str | None, epilog: str | None = None) -> argparse.ArgumentParser:
    """A verb's parser, formatted as every other verb's."""
    return argparse.ArgumentParser(prog=prog, description=description, epilog=epilog, formatter_class=HelpFormatter)


MODEL = Flag("model", "checkpoint dir, .gguf file, or alias", none_means="the built-in smollm2-135m")
DTYPE = Flag("dtype", "weights and arithmetic. auto: fp32 checkpoints stay fp32; half-precision and GGUF checkpoints "
                      "take the path measured fastest on this CPU at first start (tally tune; cached), which tally "
                      "plan counts as bfloat16; float16: fp16 weights, fp32 arithmetic; vLLM's float and half "
                      "read as float32 and float16",
             default="auto", type=canonical(DTYPE_ALIASES), choices=DTYPES)
QUANTIZATION = Flag("quantization", "quantize on the fly (int8, int4, w8a8); gguf: a GGUF file's blocks as stored "
                                    "(the default for GGUF files); none: dequantize them",
                    choices=(*QUANTIZATIONS, "none"), aliases=("-q",))
KV_CACHE_DTYPE = Flag("kv_cache_dtype", "the KV cache's values. auto: the compute dtype (exact), but float16 for "
                                        "quantized weights computed in fp32, such as a GGUF's blocks as stored "
                                        "(llama.cpp's f16); float16 and bfloat16 halve fp32's bytes, int8 halves "
                                        "them again "
                                        "(with a scale per token and head); attention reads each in place with fp32 "
                                        "arithmetic. The CPU engine stores auto, float32, float16, bfloat16 and int8; "
                                        "tally plan also plans fp8 (GPU devices)",
                      default="auto", type=canonical(KV_CACHE_DTYPE_ALIASES), choices=KV_CACHE_DTYPES)
MAX_MODEL_LEN = Flag("max_model_len", "longest prompt + output in tokens", type=int, none_means="the model's context")
MAX_NUM_SEQS = Flag("max_num_seqs", "requests decoded together at most", default=128,
                    type=int)
MAX_NUM_BATCHED_TOKENS = Flag("max_num_batched_tokens", "tokens one step computes at most",
                              default=2048, type=int)
SWAP_SPACE = Flag("swap_space", "GiB of RAM beside the KV pool where preempted requests' KV blocks may wait instead "
                  "of being recomputed (vLLM's flag); taken only while they wait; 0: off", default=4.0, type=float,
                  metavar="GiB")
BLOCK_SIZE = Flag("block_size", "tokens per KV cache block", default=16, type=int)
KV_CACHE_MEMORY = Flag("kv_cache_memory", "bytes for the KV pool, e.g. 2GiB", type=parse_bytes,
                       none_means="min(fraction of free RAM, 2 GiB)")
THREADS = Flag("threads", "CPU threads of the model's kernels, per tensor-parallel rank", type=int,
               aliases=("--cpu-threads",), none_means="the physical cores this process, or rank, may run on")
TENSOR_PARALLEL_SIZE = Flag("tensor_parallel_size", "processes (devices) the model's layers are split over: heads, MLP "
                                                    "columns, vocabulary; torch.distributed gloo on CPUs, under "
                                                    "torchrun one per rank, else started here on this machine's CPUs",
                            default=1, type=int, aliases=("-tp", "--tp"))
PIPELINE_PARALLEL_SIZE = Flag("pipeline_parallel_size", "stages the model's layers are split over, each a contiguous "
                                                        "run of layers, micro-batches flowing through them; with "
                                                        "tensor_parallel_size N, N x this many processes",
                              default=1, type=int, aliases=("-pp", "--pp"))
CONCURRENCY = Flag("concurrency", "requests in flight", type=int, metavar="N")
REPLICAS = Flag("replicas", "copies of the server (one engine each) to run", type=int, metavar="N")
METRICS_PREFIX = Flag("metrics_prefix", "the prefix of the /metrics series: vllm: vllm:... so dashboards and alerts "
                                        "built for vLLM work; tally: tally:...",
                      default="tally", choices=tuple(METRICS_PREFIXES))
WINDOW = Flag("window", "range each rate and quantile covers (a Prometheus duration)", default="5m")
HOST = Flag("host", "address to listen on", default="127.0.0.1")
PORT = Flag("port", "port to listen on", default=8000, type=int)
LOG_LEVEL = Flag("log_level", "log messages from this level up", default="info", choices=LOG_LEVELS)
REQUEST_TIMEOUT = Flag("request_timeout", "seconds a request may take before it is answered 504", type=float,
                       none_means="no limit")
MAX_BODY_BYTES = Flag("max_body_bytes", "larger bodies get 413", default="16MiB", type=parse_bytes)
MAX_CONNECTIONS = Flag("max_connections", "open connections at most; one more is closed as it is accepted",
                       default=1024, type=int)
HEADER_TIMEOUT = Flag("header_timeout", "seconds a connection has to send a request's headers, from its opening or "
                                        "its previous answer's end", default=10.0, type=float)
DRAIN_TIMEOUT = Flag("drain_timeout", "seconds running requests may finish after SIGTERM before they are cancelled",
                     default=30.0, type=float)
MAX_TOKENS = Flag("max_tokens", "tokens generated per request at most", type=int)
OUT = Flag("out", "where the result is written", type=Path, metavar="PATH")
JSON = Flag("json", "print the result as JSON on stdout instead of the table", default=False, action="store_true")
QUIET = Flag("quiet", "no progress bars or lines on stderr (bars show only on a terminal)", default=False,
             action="store_true")
