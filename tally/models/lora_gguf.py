"""A LoRA adapter in llama.cpp's GGUF (what convert_lora_to_gguf.py writes) read as the settings and tensors of the
PEFT folder it was converted from, so that both go through the same checks (tally/models/lora_adapter.py); the q/k
rows llama.cpp's converter interleaved are put back in order, as for a GGUF base model."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

from tally.errors import ModelLoadError
from tally.models.config import ModelConfig
from tally.models.families import Family, family, gguf_family
from tally.models.gguf_checkpoint import LAYER_NAMES, is_readable, readable_types, tensor_values, unpermute_orders
from tally.models.gguf_header import GGUFHeader, read_header
from tally.models.lora_adapter import TARGETS, LoRAAdapter, adapter_from, bad

_TENSOR = re.compile(r"^blk\.(\d+)\.(\w+\.weight)\.lora_([ab])$")


def load_gguf_adapter(name: str, path: str, cfg: ModelConfig, max_rank: int, dtype: torch.dtype) -> LoRAAdapter:
    file = Path(path)
    if not file.is_file():
        raise bad(f"LoRA adapter {name!r}: there is no file {path}")
    try:
        header = read_header(file)
    except ModelLoadError as exc:
        raise bad(f"LoRA adapter {name!r}: {exc}") from None
    meta = header.metadata
    fam = _checked_family(name, path, header, cfg)
    raw = file.read_bytes()
    blob = np.frombuffer(raw, dtype=np.uint8)
    # convert_hf_to_gguf interleaves q/k rows for these families, and the LoRA converter does the same to lora_b
    orders = unpermute_orders(cfg) if fam.gguf_rope_permuted else {}
    tensors = {}
    for info in header.tensors:
        if not is_readable(info.ggml_type):
            raise bad(f"LoRA adapter {name!r}: tensor {info.name} is stored as {info.ggml_type.name}, which Tally "
                      f"cannot read; convert with --outtype f32, f16, bf16 or q8_0 (Tally reads {readable_types()})")
        data = blob[info.offset:info.offset + info.nbytes].reshape(*info.shape[:-1], -1)
        values = tensor_values(info.ggml_type, data).reshape(info.shape)
        key, module, half = _peft_name(info.name, fam.gguf_names)
        order = orders.get(module)
        if half == "B" and order is not None and len(order) == values.shape[0]:  # other lengths fail the shape check
            values = values[order]
        tensors[key] = values
    ranks = [t.shape[0] for key, t in tensors.items() if key.endswith("lora_A.weight")]
    if not ranks:
        raise bad(f"LoRA adapter {name!r}: {path} holds no LoRA tensors (blk.N.<projection>.weight.lora_a / lora_b)")
    alpha = float(meta.get("adapter.lora.alpha", 0.0))
    # llama.cpp scales by alpha / rank, and by 1 where alpha is 0 (or absent)
    conf = {"r": ranks[0], "lora_alpha": alpha or ranks[0]}
    return adapter_from(name, path, conf, tensors, raw, cfg, max_rank, dtype)


def _checked_family(name: str, path: str, header: GGUFHeader, cfg: ModelConfig) -> Family:
    """The family the adapter was converted for, once the file is known to be a plain LoRA for this base."""
    meta = header.metadata
    kind = meta.get("general.type", "model")
    if kind != "adapter":
        raise bad(f"LoRA adapter {name!r}: {path} is a GGUF {kind}, not an adapter (its general.type is {kind!r}); "
                  "give the .gguf file llama.cpp's convert_lora_to_gguf.py wrote")
    if meta.get("adapter.type") != "lora":
        raise bad(f"LoRA adapter {name!r}: {path} is a {meta.get('adapter.type')!r} adapter; only LoRA is served")
    if "adapter.alora.invocation_tokens" in meta:
        raise bad(f"LoRA adapter {name!r} is an activated LoRA (adapter.alora.invocation_tokens), which is not "
                  "supported: serve a plain LoRA")
    try:
        fam = gguf_family(header.architecture, path)
    except ModelLoadError as exc:
        raise bad(f"LoRA adapter {name!r}: {exc}") from None
    if fam.gguf_rope_permuted != family(cfg.architecture).gguf_rope_permuted:
        raise bad(f"LoRA adapter {name!r} was converted for a {header.architecture!r} model, but the base model is "
                  f"{cfg.architecture}: convert it again with --base pointing at this base model's folder")
    return fam


def _peft_name(gguf_name: str, family_names: dict[str, str]) -> tuple[str, str | None, str | None]:
    """(PEFT's name of a LoRA tensor, its HF module, "A" or "B"); a tensor that is not a LoRA A/B of a projection
    keeps its GGUF name, which the checks refuse by name."""
    m = _TENSOR.match(gguf_name)
    ours = m and (family_names.get(m.group(2)) or LAYER_NAMES.get(m.group(2)))
    module = ours and ours.split(".")[-2]
    if module not in TARGETS:
        return gguf_name, None, None
    half = m.group(3).upper()
    return f"base_model.model.model.layers.{m.group(1)}.{ours.removesuffix('.weight')}.lora_{half}.weight", module, half
