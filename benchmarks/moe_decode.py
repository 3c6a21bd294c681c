"""Decode speed of a mixture of experts from a q8_0 GGUF, for each expert family (`--family`: Qwen3-MoE, Mixtral,
OLMoE, GPT-OSS with its sinks, biases and clamped SwiGLU; or all): its experts' stored blocks in one native call a
layer (and the one-call decode step), against the same blocks through the per-expert PyTorch loop, with
`--dequantized` the experts dequantized to fp32 (`quantization="none"`, 3.8x the GGUF's bytes in memory), and a dense
Llama of the same active size: tokens per second, and at batch 1 the weight bytes a token reads (the routed experts'
only) per second against the dense model's, i.e. the share of the dense model's roofline the experts reach (a ratio,
so a busy host's drifting read rate cancels). Each family's cases alternate; a family's line before its rows names the
GGUF's types and where its experts run. Random weights (8 experts of half the dense model's MLP with 2 routed;
SmolLM2's 49,152 tokens), written a layer at a time and converted by llama.cpp's own converter
(tests/support/families.py); nothing is downloaded. The shape is chosen at run time from the last-level cache, which
it prints: from hidden 1024 (MLP 2816, experts of 1408) and 8 layers, deeper (up to 64 layers), then wider, until the
dense model's active weights are twice the cache. Both models then stream their weights from memory; a dense model
the cache holds would read at the cache's rate, which the experts, 4x its MLP's bytes in all, cannot. `--layers` and
`--hidden` force a shape. `--tile-rows` first times one thread over every expert's gate_up at 1-4 rows (its CPU time,
which a busy host's waits leave out): what a pass over an expert's weights costs in rows' products, the weight
tally/native/experts.h gives each expert's share of a parallel region.

    python benchmarks/moe_decode.py [--family qwen3_moe,mixtral,olmoe,gpt_oss|all] [--tokens 32] [--threads 2]
                                    [--repeats 3] [--batches 1,8] [--layers N] [--hidden H] [--dequantized]
                                    [--tile-rows]
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import tally  # noqa: F401  first: it sets OpenMP's waiting policy before torch loads libgomp
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode_roofline import weight_bytes_read_per_step  # noqa: E402

VOCAB = 49152  # SmolLM2's tokenizer's
MAX_LAYERS = 64  # past it the fair shape widens instead


def shape(hidden: int, layers: int) -> dict:
    """The dense model's config at `hidden` (a multiple of 256): heads of 64, a quarter of them for keys and values,
    an MLP of 2.75x hidden (1024 -> 2816)."""
    return dict(hidden_size=hidden, intermediate_size=hidden * 11 // 4, num_hidden_layers=layers,
                num_attention_heads=hidden // 64, num_key_value_heads=hidden // 256, head_dim=64,
                max_position_embeddings=4096)


def experts(family: str, hidden: int) -> tuple[str, dict]:
    """The family's test fixture and what sets it at `hidden`: 8 experts of half the dense model's MLP with 2 routed,
    under the names its config class gives them. Mixtral's fixture has a 400-token SentencePiece vocabulary: Mixtral
    is built on OLMo 2's fixture renamed instead, for SmolLM2's tokens as the others and the dense model have."""
    size = hidden * 11 // 8
    return {
        "qwen3_moe": ("qwen3_moe", dict(moe_intermediate_size=size, num_experts=8, num_experts_per_tok=2)),
        "mixtral": ("olmo2", dict(model_type="mixtral", architectures=["MixtralForCausalLM"], intermediate_size=size,
                                  num_local_experts=8, num_experts_per_tok=2)),
        "olmoe": ("olmoe", dict(intermediate_size=size, num_experts=8, num_experts_per_tok=2)),
        # gpt-oss-20b's window and YaRN; its sinks, biases and clamped SwiGLU from the fixture and the config's defaults
        "gpt_oss": ("gpt_oss", dict(intermediate_size=size, num_local_experts=8, num_experts_per_tok=2,
                                    sliding_window=128, max_position_embeddings=131072,
                                    rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=32.0,
                                                         beta_fast=32.0, beta_slow=1.0, truncate=False,
                                                         original_max_position_embeddings=4096))),
    }[family]


FAMILIES = ["qwen3_moe", "mixtral", "olmoe", "gpt_oss"]
DENSE = dict(model_type="llama", architectures=["LlamaForCausalLM"])  # OLMo 2's fixture renamed: its tokenizer


def last_level_cache_bytes() -> int:
    """The size of the largest cache of the highest level CPU 0 reads through (sysfs), or 0 where it is not told."""
    levels = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            kind, level, size = ((index / n).read_text().strip() for n in ("type", "level", "size"))
        except OSError:
            continue
        if kind != "Instruction" and size[-1:] in "KMG":
            levels.append((int(level), int(size[:-1]) << {"K": 10, "M": 20, "G": 30}[size[-1]]))
    return max(levels, default=(0, 0))[1]


def dense_active_bytes(hidden: int, layers: int) -> int:
    """The q8_0 weight bytes a batch-1 token of the dense model reads: its layers' attention and MLP, and the head."""
    config = shape(hidden, layers)
    attention = 2 * hidden * (config["num_attention_heads"] + config["num_key_value_heads"]) * 64
    return (layers * (attention + 3 * hidden * config["intermediate_size"]) + VOCAB * hidden) * 34 // 32


def fair_shape(cache_bytes: int) -> tuple[int, int]:
    """(hidden, layers): from hidden 1024 and 8 layers, deepened (up to MAX_LAYERS) and then widened, the smallest shape
    whose dense model's active bytes are at least twice `cache_bytes` (why: this file's docstring)."""
    hidden = 1024
    while True:
        layer_bytes = dense_active_bytes(hidden, 1) - dense_active_bytes(hidden, 0)
        layers = max(8, -(-(2 * cache_bytes - dense_active_bytes(hidden, 0)) // layer_bytes))
        if layers <= MAX_LAYERS:
            return hidden, layers
        hidden *= 2


def active_bytes(model: torch.nn.Module) -> int:
    """Weight bytes a batch-1 decode token reads: every weight once (the token table's one row), of each layer's
    experts only the routed ones' share."""
    total = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()]
                if t.dim() > 1 or t.dtype != torch.float32)  # weights; norms, biases and rotary tables aside
    skipped = 0
    for layer in model.layers:
        moe = layer.experts
        if moe is not None:
            held = sum(m.weight_nbytes() if hasattr(m, "weight_nbytes") else m.out_features * m.in_features * 4
                       for m in [*moe.gate_up, *moe.down])  # dense experts: fp32, as panels or a weight
            skipped += held * (1 - moe.top_k / len(moe.down))
    return int(weight_bytes_read_per_step(model, total) - skipped)


def tokens_per_s(llm, batch: int, tokens: int) -> float:
    """Decode tokens per second of `batch` 16-token prompts: the time of `tokens` tokens less that of one."""
    from tally import SamplingParams

    prompts = [{"prompt_token_ids": [100 + 7 * r + i for i in range(16)]} for r in range(batch)]

    def timed(n: int) -> float:
        start = time.perf_counter()
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True), use_tqdm=False)
        return time.perf_counter() - start

    return batch * (tokens - 1) / (timed(tokens) - timed(1))


def tile_rows_cost(llm, threads: int, repeats: int) -> None:
    """One thread's CPU time for every expert's gate_up over 1-4 rows (best of `repeats`, alternating), fitted as
    pass + rows * row: the pass over the weights in rows' products."""
    from tally.models.native_decode_step import scale_form
    from tally.native.library import load

    torch.set_num_threads(1)
    projections = [m for layer in llm.engine.model.layers for m in layer.experts.gate_up]
    x, y = torch.randn(4, projections[0].in_features), torch.empty(4, projections[0].out_features)
    best: dict[int, float] = {}
    for _ in range(repeats):
        for rows in (1, 2, 3, 4):
            start = time.thread_time()
            for m in projections:  # the kernel itself: a module's call adds an allocation and torch's dispatch
                load().tally_gemm_q8(x.data_ptr(), m.q.data_ptr(), m.s.data_ptr(), None, y.data_ptr(), rows,
                                     m.out_features, m.in_features, m.group_size, 0, 0, scale_form(m.s), m.symmetric)
            best[rows] = min(best.get(rows, float("inf")), time.thread_time() - start)
    torch.set_num_threads(threads)
    row = (best[4] - best[1]) / 3
    print("one thread, every expert's gate_up: " + ", ".join(f"{r} rows {t * 1e3:.1f} ms" for r, t in best.items())
          + f"; the weights' pass is worth {(best[1] - row) / row:.2f} rows")


def expert_path(model: torch.nn.Module) -> str:
    """Where the experts run: the native call in how many expert layers, on which stored formats, and whether the
    one-call decode step (and so bursts of steps) takes the whole step."""
    moes = [layer.experts for layer in model.layers if layer.experts is not None]
    native = sum(moe.native() is not None for moe in moes)
    schemes = sorted({getattr(m, "scheme", type(m).__name__) for moe in moes for m in [*moe.gate_up, *moe.down]})
    step = "one-call decode step" if model.native_step is not None else "NO one-call decode step"
    return f"native call in {native}/{len(moes)} expert layers ({', '.join(schemes)}), {step}, {huge_pages(model)}"


def huge_pages(model: torch.nn.Module) -> str:
    """How much of the weights the kernel backs with 2 MB pages (tally/layers/huge_pages.py): fewer, where it found
    too few free, cost a step TLB misses, which a ratio between two models would take for the experts' cost."""
    held = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    return f"{model.huge_page_bytes / 2**20:.0f} of {held / 2**20:.0f} MiB on huge pages"


def gguf_types(path: Path) -> str:
    """The GGML types of a GGUF's matrices: its experts', its routers' and the others'."""
    import gguf
    from support.families import read_gguf_header

    kinds: dict[str, set[str]] = {"experts": set(), "routers": set(), "other matrices": set()}
    for name, (ggml_type, shape) in read_gguf_header(path).tensors.items():
        if len(shape) > 1 and name.endswith(".weight"):  # GPT-OSS's experts' biases are [experts, rows]
            kind = "experts" if "_exps." in name else "routers" if ".ffn_gate_inp." in name else "other matrices"
            kinds[kind].add(gguf.GGMLQuantizationType(ggml_type).name)
    return "; ".join(f"{kind} {'/'.join(sorted(types))}" for kind, types in kinds.items())


def measure(family: str, native: tally.LLM, dequantized: tally.LLM | None, dense: tally.LLM, batches: list[int],
            tokens: int, repeats: int) -> None:
    """One family's rows of the table and its ratios: the cases alternating, each batch in turn."""
    # (name, engine, whether its experts run the per-expert PyTorch loop: then neither bursts of steps nor the
    # one-call step, which need the native call)
    cases = [("experts native", native, False), ("experts loop", native, True),
             *([("dequantized", dequantized, False)] if dequantized else []), ("dense q8_0", dense, False)]
    saved = native.engine.model.native_step, native.engine._burst_limit

    def loop(on: bool) -> None:
        for layer in native.engine.model.layers:
            layer.experts.use_native = not on
        native.engine.model.native_step, native.engine._burst_limit = (None, 1) if on else saved

    rates: dict[tuple[str, int], float] = {}
    streamed: dict[str, float] = {}  # batch 1's weight bytes a second
    for batch in batches:
        runs: dict[str, list[float]] = {name: [] for name, *_ in cases}
        for _ in range(repeats + 1):  # the cases alternate (a shared host's load drifts); the first warms up
            for name, llm, looped in cases:
                loop(looped)
                runs[name].append(tokens_per_s(llm, batch, tokens))
        loop(False)
        for name, llm, _ in cases:
            rate, per_token = statistics.median(runs[name][1:]), active_bytes(llm.engine.model)
            rates[name, batch] = rate
            streamed.setdefault(name, rate * per_token / 1e9)
            print(f"{family:<10} {name:<15} {batch:>5} {rate:>8.1f} {per_token / 1e6:>9.1f} "
                  f"{rate * per_token / 1e9:>6.2f}", flush=True)
    if 1 in batches:
        print(f"{family}, batch 1, share of the dense model's roofline (weight bytes a second): "
              + ", ".join(f"{name} {streamed[name] / streamed['dense q8_0']:.2f}" for name in streamed))
    for batch in batches:
        ratio = rates["experts native", batch]
        others = [(name.replace("experts ", "").replace(" q8_0", ""), rates[name, batch]) for name, *_ in cases[1:]]
        print(f"{family}, batch {batch}: " + ", ".join(f"native / {name} {ratio / rate:.2f}x" for name, rate in others),
              flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", default="qwen3_moe", help=f"comma-separated, of {', '.join(FAMILIES)}; or all")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batches", default="1,8")
    p.add_argument("--tile-rows", action="store_true", help="first time one thread's expert tiles at 1-4 rows")
    p.add_argument("--dequantized", action="store_true",
                   help="also time the experts dequantized to fp32 (3.8x the GGUF's bytes in memory)")
    p.add_argument("--hidden", type=int, help="force the hidden size (a multiple of 256) instead of the fair shape's")
    p.add_argument("--layers", type=int, help="force the number of layers instead of the fair shape's")
    a = p.parse_args()
    families = FAMILIES if a.family == "all" else a.family.split(",")
    if unknown := [f for f in families if f not in FAMILIES]:
        p.error(f"unknown --family {', '.join(unknown)}; choose from {', '.join(FAMILIES)} or all")
    if a.hidden is not None and (a.hidden < 256 or a.hidden % 256):
        p.error(f"--hidden {a.hidden} is not a positive multiple of 256 (heads of 64, a quarter of them for keys)")
    if a.layers is not None and a.layers < 1:
        p.error(f"--layers {a.layers} must be at least 1")
    batches = [int(b) for b in a.batches.split(",")]
    cache_bytes = last_level_cache_bytes()
    hidden, layers = fair_shape(cache_bytes)
    hidden, layers = a.hidden or hidden, a.layers or layers
    print(f"last-level cache {cache_bytes / 2**20:.0f} MiB" if cache_bytes else "last-level cache unknown", end="; ")
    print(f"shape: hidden {hidden}, {layers} layers, 8 experts of {hidden * 11 // 8} with 2 routed vs a dense MLP of "
          f"{hidden * 11 // 4}; the dense model's active weights {dense_active_bytes(hidden, layers) / 2**20:.0f} MiB"
          + (" (forced)" if a.hidden or a.layers else ""), flush=True)
    from support.families import make_family_checkpoint, to_gguf
    from tally import LLM

    work = Path(tempfile.mkdtemp(prefix="tally-moe-"))

    def gguf(name: str, fixture: str, config: dict) -> Path:
        """The q8_0 GGUF of a random checkpoint, written a layer at a time; the checkpoint is deleted once converted."""
        hf_dir = make_family_checkpoint(work / name, fixture, by_layer=True, **config)
        try:
            return to_gguf(hf_dir, work / f"{name}.gguf", "q8_0")
        finally:
            shutil.rmtree(hf_dir)

    try:
        engine = dict(dtype="float32", threads=a.threads, max_model_len=256, kv_cache_memory=64 * 2**20,
                      enable_prefix_caching=False)
        dense = LLM(str(gguf("dense", "olmo2", shape(hidden, layers) | DENSE)), **engine)
        print(f"dense: {huge_pages(dense.engine.model)}")
        print(f"{'family':<10} {'model':<15} {'batch':>5} {'tok/s':>8} {'MB/token':>9} {'GB/s':>6}")
        for family in families:
            fixture, config = experts(family, hidden)
            path = gguf(family, fixture, shape(hidden, layers) | config)
            native = LLM(str(path), **engine)
            dequantized = LLM(str(path), quantization="none", **engine) if a.dequantized else None
            print(f"{family}: GGUF {gguf_types(path)}; experts: {expert_path(native.engine.model)}"
                  + (f"; dequantized: {expert_path(dequantized.engine.model)}" if dequantized else ""), flush=True)
            if a.tile_rows:
                tile_rows_cost(native, a.threads, 2 * a.repeats + 1)
            measure(family, native, dequantized, dense, batches, a.tokens, a.repeats)
            del native, dequantized  # their memory, before the next family's
            path.unlink()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("command: python " + " ".join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
