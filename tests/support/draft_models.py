"""Draft models for speculative-decoding tests, built from a tiny target checkpoint: they share its tokenizer."""
from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from support.tiny_models import make_checkpoint


def make_small_draft(out_dir: Path) -> Path:
    """A smaller model of its own random weights (one layer, half the width): it rarely agrees with the target."""
    return make_checkpoint(out_dir, "llama", seed=1, num_hidden_layers=1, hidden_size=32, intermediate_size=64,
                           num_attention_heads=2, num_key_value_heads=1)


def make_perturbed_draft(target_dir: Path, out_dir: Path, noise: float = 0.05) -> Path:
    """The target with noise on its LM head: its distribution q differs from the target's p, and its proposals
    are accepted about a third of the time."""
    shutil.copytree(target_dir, out_dir, dirs_exist_ok=True)
    weights = load_file(out_dir / "model.safetensors")
    gen = torch.Generator().manual_seed(1)
    head = weights["lm_head.weight"]
    weights["lm_head.weight"] = head + noise * torch.randn(head.shape, generator=gen)
    save_file(weights, out_dir / "model.safetensors", metadata={"format": "pt"})
    return out_dir
