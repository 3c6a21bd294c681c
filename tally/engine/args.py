"""Engine flags shared by `tally generate` and `tally serve`, named like vLLM's."""
from __future__ import annotations

import argparse

from tally.engine.config import EngineConfig
from tally.ledger.units import parse_bytes  # one byte-size parser for every CLI


def add_engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--model", default=None, help="checkpoint dir, .gguf file, or alias (default: smollm2-135m)")
    g.add_argument("--served-model-name", default=None)
    g.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="float16: fp16 weights, fp32 compute (auto picks it for half-precision and GGUF "
                        "checkpoints on CPUs without bf16 instructions)")
    g.add_argument("--quantization", "-q", default=None, choices=["int8", "int4", "w8a8", "gguf"],
                   help="quantize on the fly (int8, int4, w8a8), or gguf: run a GGUF file's blocks as stored")
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--max-num-seqs", type=int, default=128)
    g.add_argument("--max-num-batched-tokens", type=int, default=2048)
    g.add_argument("--max-num-partial-prefills", type=int, default=1)
    g.add_argument("--no-enable-chunked-prefill", dest="enable_chunked_prefill", action="store_false")
    g.add_argument("--enable-prefix-caching", dest="enable_prefix_caching", action="store_true", default=True)
    g.add_argument("--no-enable-prefix-caching", dest="enable_prefix_caching", action="store_false")
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "float32", "bfloat16", "int8"])
    g.add_argument("--kv-cache-memory", type=parse_bytes, default=None,
                   help="bytes for the KV pool, e.g. 2GiB (default: a fraction of free RAM)")
    g.add_argument("--kv-cache-memory-fraction", type=float, default=0.25)
    g.add_argument("--scheduling", default="continuous", choices=["continuous", "static"])
    g.add_argument("--attention-backend", default="auto", choices=["auto", "reference", "tiled"])
    g.add_argument("--seed", type=int, default=0)


def config_from_args(ns: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=ns.model, served_model_name=ns.served_model_name, dtype=ns.dtype, quantization=ns.quantization,
        max_model_len=ns.max_model_len, max_num_seqs=ns.max_num_seqs,
        max_num_batched_tokens=ns.max_num_batched_tokens, max_num_partial_prefills=ns.max_num_partial_prefills,
        enable_chunked_prefill=ns.enable_chunked_prefill, enable_prefix_caching=ns.enable_prefix_caching,
        block_size=ns.block_size, kv_cache_dtype=ns.kv_cache_dtype, kv_cache_memory=ns.kv_cache_memory,
        kv_cache_memory_fraction=ns.kv_cache_memory_fraction, scheduling=ns.scheduling,
        attention_backend=ns.attention_backend, seed=ns.seed,
    )
