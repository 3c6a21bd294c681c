"""An encoder from its HF folder: config.json (tally/models/encoders/config.py) and safetensors under transformers'
names, with or without the `bert.` / `roberta.` prefix a *ForSequenceClassification or *ForMaskedLM adds, mapped
onto tally/models/encoders/bert.py's modules and checked whole."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from tally.errors import ModelLoadError
from tally.models.encoders.bert import Encoder
from tally.models.encoders.config import EncoderConfig
from tally.models.hf_checkpoint import INDEX_FILE, SINGLE_FILE

_PREFIXES = ("bert.", "roberta.", "model.")
# what checkpoints carry that an embedding or scoring forward never reads: pre-training heads, buffers
_UNUSED = re.compile(r"^(cls\.|lm_head\.|embeddings\.position_ids$|pooler\.)")
_RENAMES = [  # (transformers' name, Tally's), by pattern; a layer's q, k, v are fused after reading
    (r"^embeddings\.LayerNorm\.", "embed_norm."),
    (r"^embeddings\.(word|position|token_type)_embeddings\.", r"\1_embeddings."),
    (r"^encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)\.", r"layers.\1.\2."),
    (r"^encoder\.layer\.(\d+)\.attention\.output\.dense\.", r"layers.\1.attn_out."),
    (r"^encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.", r"layers.\1.attn_norm."),
    (r"^encoder\.layer\.(\d+)\.intermediate\.dense\.", r"layers.\1.up."),
    (r"^encoder\.layer\.(\d+)\.output\.dense\.", r"layers.\1.down."),
    (r"^encoder\.layer\.(\d+)\.output\.LayerNorm\.", r"layers.\1.mlp_norm."),
    (r"^classifier\.dense\.", "classifier.dense."),  # RoBERTa's head, or BERT's pooler renamed in _renamed
    (r"^classifier\.out_proj\.", "classifier.out."),
    (r"^classifier\.", "classifier.out."),  # BERT's linear
]


@dataclass(frozen=True)
class EncoderCheckpoint:
    """What the tokenizer loader reads of a checkpoint (tally/models/tokenizer.py)."""

    path: Path
    name: str
    format: str = "hf"


def load_encoder(path: Path, cfg: EncoderConfig, dtype: torch.dtype) -> Encoder:
    model = Encoder(cfg)
    wanted = model.state_dict()
    tensors = _renamed(_read(path), cfg)
    for i in range(cfg.num_layers):
        parts = [tensors.pop(f"layers.{i}.{p}.{kind}", None) for kind in ("weight", "bias")
                 for p in ("query", "key", "value")]
        if all(p is not None for p in parts):
            tensors[f"layers.{i}.qkv.weight"] = torch.cat(parts[:3])
            tensors[f"layers.{i}.qkv.bias"] = torch.cat(parts[3:])
    missing = sorted(set(wanted) - set(tensors))
    extra = sorted(set(tensors) - set(wanted))
    if missing or extra:
        raise ModelLoadError(f"{path}: the weights do not make a {cfg.architecture or cfg.model_type}: missing "
                             f"{missing[:5]}, unexpected {extra[:5]}")
    for name, t in tensors.items():
        if tuple(t.shape) != tuple(wanted[name].shape):
            raise ModelLoadError(f"{path}: {name} has shape {tuple(t.shape)}, config.json implies "
                                 f"{tuple(wanted[name].shape)}")
    model.load_state_dict(tensors)
    return model.to(dtype).eval()


def _renamed(stored: dict[str, torch.Tensor], cfg: EncoderConfig) -> dict[str, torch.Tensor]:
    out = {}
    for name, t in stored.items():
        name = name.removeprefix(next((p for p in _PREFIXES if name.startswith(p)), ""))
        name = name.replace(".gamma", ".weight").replace(".beta", ".bias")  # the first BERT checkpoints' names
        if cfg.is_cross_encoder and cfg.model_type == "bert" and name.startswith("pooler.dense."):
            name = name.replace("pooler.dense.", "classifier.dense.")  # BERT's head starts at its pooler
        elif _UNUSED.match(name):
            continue
        for pattern, repl in _RENAMES:
            if re.match(pattern, name):
                name = re.sub(pattern, repl, name)
                break
        out[name] = t.float()
    return out


def _read(path: Path) -> dict[str, torch.Tensor]:
    index = path / INDEX_FILE
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (path / SINGLE_FILE).is_file():
        files = [SINGLE_FILE]
    else:
        raise ModelLoadError(f"{path} has no {SINGLE_FILE} (or {INDEX_FILE}); Tally reads safetensors: convert the "
                             "checkpoint's pytorch_model.bin with transformers' save_pretrained()")
    tensors = {}
    for file in files:
        with safe_open(str(path / file), framework="pt") as f:
            tensors |= {name: f.get_tensor(name) for name in f.keys()}
    return tensors
