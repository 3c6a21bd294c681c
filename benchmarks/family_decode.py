"""Decode speed of each family on the native fast paths against the same model on the PyTorch layers (forced), and
against a plain Llama of the same shape, all measured in the same run: batch 1 and batch 8, fp32 weights (the fused
native layers, PyTorch's matmuls) and int8 weights (every layer of a step in one native call). Random weights at a
moderately realistic shape (hidden 1024, 8 layers, 16 heads of 64, 4 KV heads, vocabulary 32,768), built from
transformers' own config classes by the test fixtures' builder (tests/support/families.py); nothing is downloaded.

    python benchmarks/family_decode.py [--families llama3,qwen3,...] [--formats fp32,int8] [--tokens 32] [--repeats 3]
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

SHAPE = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
             num_key_value_heads=4, head_dim=64, vocab_size=32768, max_position_embeddings=4096)
# What each fixture sets at its tiny shape that must follow the shape here: windows a decode stays inside, Phi-4-mini's
# partial rotary without LongRoPE's per-dimension factors (their count follows the head size).
AT_SHAPE = {
    "gemma2": dict(sliding_window=512), "gemma3": dict(sliding_window=512), "mistral": dict(sliding_window=512),
    "phi3": dict(rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.75)),
    # two of eight experts of half llama's MLP: the active size of the dense llama (`--families qwen3_moe`)
    "qwen3_moe": dict(moe_intermediate_size=1408, num_experts=8, num_experts_per_tok=2),
    "llama": dict(model_type="llama", architectures=["LlamaForCausalLM"]),
    "qwen3": dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"]),
}
FAMILIES = ("llama", "llama3", "qwen3", "gemma2", "gemma3", "phi3", "granite", "olmo2", "smollm3", "mistral")
FORMATS = {"fp32": None, "int8": "int8"}


def build(family: str, out: Path) -> Path:
    from support.families import FAMILIES as FIXTURES
    from support.families import make_family_checkpoint

    # llama and qwen3 have no fixture there: OLMo 2's (no traits in its config, SmolLM2's tokenizer) renamed
    return make_family_checkpoint(out / family, family if family in FIXTURES else "olmo2",
                                  **SHAPE, **AT_SHAPE.get(family, {}))


def decode_tokens_per_s(llm, batch: int, tokens: int, native: bool) -> float:
    """Decode tokens per second of `batch` requests of 16-token prompts on the native paths or (`native` False) on
    the PyTorch layers, one step a call: the time of `tokens` tokens less that of one (the prefill)."""
    from tally import SamplingParams

    engine, model = llm.engine, llm.engine.model
    saved = [layer.native for layer in model.layers], model.native_step, engine._burst_limit
    if not native:
        for layer in model.layers:
            layer.native = False
        model.native_step, engine._burst_limit = None, 1  # bursts of steps need the one-call step
    prompts = [{"prompt_token_ids": [100 + 7 * r + i for i in range(16)]} for r in range(batch)]

    def timed(n: int) -> float:
        start = time.perf_counter()
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
        return time.perf_counter() - start

    try:
        return batch * (tokens - 1) / (timed(tokens) - timed(1))
    finally:
        for layer, was in zip(model.layers, saved[0]):
            layer.native = was
        model.native_step, engine._burst_limit = saved[1], saved[2]


def paired_rates(llm, batch: int, tokens: int, repeats: int) -> tuple[float, float]:
    """(PyTorch, native) tokens per second, medians of runs that alternate (a shared machine's load drifts)."""
    decode_tokens_per_s(llm, batch, 4, native=True)  # warm-up
    runs = [(decode_tokens_per_s(llm, batch, tokens, False), decode_tokens_per_s(llm, batch, tokens, True))
            for _ in range(repeats)]
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", default=",".join(FAMILIES))
    p.add_argument("--formats", default=",".join(FORMATS))
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    from tally import LLM

    names = a.families.split(",")
    if "llama" not in names:
        names.insert(0, "llama")
    rows: dict[tuple[str, str, int], tuple[float, float, str]] = {}
    print(f"{'family':<10} {'weights':<7} {'batch':>5} {'path':<10} {'torch tok/s':>11} {'native tok/s':>12} "
          f"{'native/torch':>12} {'/ llama':>8}")
    for family in names:
        work = Path(tempfile.mkdtemp(prefix="tally-family-"))
        try:
            model_dir = build(family, work)
            for fmt in a.formats.split(","):
                llm = LLM(str(model_dir), dtype="float32", quantization=FORMATS[fmt], threads=a.threads,
                          max_model_len=256, kv_cache_memory=64 * 2**20, enable_prefix_caching=False)
                model = llm.engine.model
                path = "one call" if model.native_step is not None else (
                    "layers" if all(layer.native for layer in model.layers) else "torch")
                for batch in (1, 8):
                    torch_rate, native_rate = paired_rates(llm, batch, a.tokens, a.repeats)
                    rows[family, fmt, batch] = (torch_rate, native_rate, path)
                    base = rows.get(("llama", fmt, batch))
                    vs_llama = f"{native_rate / base[1]:.2f}x" if base else "-"
                    print(f"{family:<10} {fmt:<7} {batch:>5} {path:<10} {torch_rate:>11.1f} {native_rate:>12.1f} "
                          f"{native_rate / torch_rate:>11.2f}x {vs_llama:>8}", flush=True)
                del llm, model
        finally:
            shutil.rmtree(work, ignore_errors=True)
    print("command: python " + " ".join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
