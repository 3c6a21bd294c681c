"""LoRA adapters of a tiny checkpoint made by PEFT itself (weights drawn at random: PEFT starts B at zero, which would
make every adapter the base model), and PEFT's merged model's greedy tokens: the oracle of the LoRA tests."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(base: Path, out: Path, seed: int, targets: list[str], r: int = 8, lora_alpha: int = 16,
                 std: float = 0.2, **config: Any) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=r, lora_alpha=lora_alpha, target_modules=targets, **config))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.normal_(0.0, std)
    peft_model.save_pretrained(out)
    return out


def edit_config(adapter: Path, **changes: Any) -> Path:
    """The adapter's adapter_config.json with `changes` written over it."""
    path = adapter / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    return adapter


def merged_greedy(base: Path, adapter: Path | None, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """transformers' greedy tokens of each prompt on the base with the adapter merged in (PEFT's merge_and_unload)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    outs = []
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids])
            full = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_tokens, do_sample=False,
                                  eos_token_id=None, pad_token_id=0)
            outs.append(full[0, len(ids):].tolist())
    return outs
