"""LoRA throughput: a batch of --requests greedy requests through `LLM.generate` on the base model, and the same
batch spread over --adapters LoRA adapters (each request its adapter, all in one batch), on one engine, the two
arms alternating for --rounds rounds; the ratio is the adapters' output tokens/s over the base's (median of the
rounds' ratios). The adapters are random PEFT-layout adapters of rank --rank on the --targets projections (default:
all seven), written for the model's shapes (nothing downloaded). Prefix caching is off, so no round reuses another's
prompts.

    python benchmarks/lora_throughput.py [--model M] [--requests 16] [--adapters 4] [--rank 16] [--prompt-tokens 128]
                                         [--max-tokens 64] [--rounds 3] [--targets q_proj,v_proj]
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import tally  # noqa: F401  first: it sets OpenMP's waiting policy before torch loads libgomp
import torch
from safetensors.torch import save_file

from tally import LLM, LoRARequest, SamplingParams
from tally.models.lora_adapter import SITES, site_shapes

PARENTS = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
           "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def write_adapter(folder: Path, cfg, rank: int, seed: int, targets: list[str]) -> Path:
    """A random LoRA adapter on the `targets` projections of every layer, as PEFT's save_pretrained writes it."""
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(cfg.num_layers):
        for site, modules in SITES.items():
            ins, outs = site_shapes(cfg, site)
            for module, out in zip(modules, outs):
                if module not in targets:
                    continue
                key = f"base_model.model.model.layers.{layer}.{PARENTS[module]}.{module}"
                tensors[f"{key}.lora_A.weight"] = torch.randn(rank, ins, generator=g) * 0.02
                tensors[f"{key}.lora_B.weight"] = torch.randn(out, rank, generator=g) * 0.02
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": targets}))
    return folder


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=None)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--adapters", type=int, default=4)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--targets", default=",".join(PARENTS), help="the projections adapted, comma-separated")
    a = p.parse_args()
    targets = a.targets.split(",")
    llm = LLM(a.model, enable_lora=True, max_loras=a.adapters, max_lora_rank=a.rank, enable_prefix_caching=False,
              max_model_len=a.prompt_tokens + a.max_tokens + 16)
    cfg = llm.engine.model.cfg
    vocab = cfg.vocab_size
    with tempfile.TemporaryDirectory() as tmp:
        loras = [LoRARequest(f"adapter{i}", i + 1, str(write_adapter(Path(tmp) / f"a{i}", cfg, a.rank, i, targets)))
                 for i in range(a.adapters)]
        params = SamplingParams(temperature=0, max_tokens=a.max_tokens, ignore_eos=True)
        arms = {"base": [None] * a.requests, f"{a.adapters} adapters": [loras[i % a.adapters]
                                                                        for i in range(a.requests)]}
        times: dict[str, list[float]] = {name: [] for name in arms}
        for r in range(a.rounds + 1):  # the first round warms up
            g = torch.Generator().manual_seed(r)
            prompts = [{"prompt_token_ids": torch.randint(3, vocab, (a.prompt_tokens,), generator=g).tolist()}
                       for _ in range(a.requests)]
            order = list(arms) if r % 2 == 0 else list(arms)[::-1]
            for name in order:
                t0 = time.perf_counter()
                llm.generate(prompts, params, use_tqdm=False, lora_request=arms[name])
                if r:
                    times[name].append(time.perf_counter() - t0)
    tokens = a.requests * a.max_tokens
    base, lora = times["base"], times[f"{a.adapters} adapters"]
    ratio = statistics.median(b / t for b, t in zip(base, lora))
    print(f"| workload | base model | {a.adapters} adapters, rank {a.rank}, {a.targets} | ratio |")
    print("|---|---|---|---|")
    print(f"| {a.requests} requests x ({a.prompt_tokens} prompt + {a.max_tokens} output) tokens | "
          f"{tokens / statistics.median(base):.1f} tok/s | {tokens / statistics.median(lora):.1f} tok/s | "
          f"**{ratio:.2f}x** |")
    print(f"rounds' ratios: {', '.join(f'{b / t:.2f}' for b, t in zip(base, lora))}")


if __name__ == "__main__":
    main()
