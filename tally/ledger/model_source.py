"""What `--model` names: a checkpoint directory, a GGUF file, a bare config.json, or a preset."""
from __future__ import annotations

import json
import re
import struct
from array import array
from dataclasses import dataclass, field, replace
from pathlib import Path

from tally.errors import ModelLoadError
from tally.ledger.gguf_file import read_gguf
from tally.ledger.presets import find_model_preset, model_preset_names
from tally.ledger.weights import WeightTensor, model_tensors
from tally.models.config import ModelConfig
from tally.models.families import read_hf_config


@dataclass(frozen=True)
class ModelSource:
    name: str
    kind: str  # preset | config | checkpoint | gguf
    config: ModelConfig
    tensors: list[WeightTensor]
    gguf_tensor_types: dict[str, int] = field(default_factory=dict)  # ggml type -> tensors, GGUF only
    quantized: bool = False  # a quantized checkpoint (PACKED_METHODS): packed projections carry stored_bytes
    stored_dtype: str | None = None  # config.json's torch_dtype, where it states one

    @property
    def is_gguf(self) -> bool:
        return self.kind == "gguf"

    @property
    def default_weights(self) -> str:
        """The weight format when --weights is not given: what the file holds."""
        return "gguf" if self.is_gguf else "stored" if self.quantized else "dense"

    @property
    def auto_dtype(self) -> str:
        """What --dtype auto computes in, as tally serve chooses: a checkpoint whose config.json says float32 stays
        fp32; half-precision and GGUF checkpoints, presets, and configs that state no dtype are counted in bfloat16
        (serve's measured path keeps their 2-byte weights)."""
        return "float32" if self.stored_dtype == "float32" else "bfloat16"

    def with_config(self, config: ModelConfig, name: str) -> "ModelSource":
        """The same model reshaped (e.g. full multi-head attention for a comparison); priced by shape."""
        return ModelSource(name, "preset", config, model_tensors(config))


def resolve_model(spec: str) -> ModelSource:
    path = Path(spec).expanduser()
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if not (path / "config.json").is_file() and len(ggufs) == 1:
            return _from_gguf(ggufs[0])
        config = read_hf_config(path / "config.json")
        tensors = model_tensors(config)
        raw = json.loads((path / "config.json").read_text())
        quant = raw.get("quantization_config") or {}
        if quant.get("quant_method") not in PACKED_METHODS:
            return ModelSource(path.name, "checkpoint", config, tensors, stored_dtype=_stored_dtype(raw))
        packed = _packed_bytes(path)
        return ModelSource(path.name, "checkpoint", config,
                           [replace(t, stored_bytes=packed.get(t.name)) for t in tensors], quantized=True,
                           stored_dtype=_stored_dtype(raw))
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return _from_gguf(path)
        config = read_hf_config(path)
        return ModelSource(path.parent.name or path.name, "config", config, model_tensors(config),
                           stored_dtype=_stored_dtype(json.loads(path.read_text())))
    preset = find_model_preset(spec)
    if preset is None:
        raise ModelLoadError(f"--model {spec!r} is neither a checkpoint directory, a .gguf file, a config.json "
                             f"nor a preset; presets: {', '.join(model_preset_names())}")
    name, config = preset
    return ModelSource(name, "preset", config, model_tensors(config))


def _stored_dtype(raw: dict) -> str | None:
    """config.json's torch_dtype (transformers 5 writes `dtype`), None where it states none."""
    return raw.get("torch_dtype") or raw.get("dtype")


def _from_gguf(path: Path) -> ModelSource:
    model = read_gguf(path)
    return ModelSource(path.name, "gguf", model.config, model.tensors, model.tensor_types)


# Checkpoints whose projections Tally serves packed as stored (docs/quantization.md): `tally quantize`'s, GPTQ,
# AWQ and compressed-tensors (llm-compressor). The plan prices each at its packed parts' bytes in the file.
PACKED_METHODS = ("tally", "gptq", "awq", "compressed-tensors")
_PACKED = re.compile(r"^(?:model\.)?(?:language_model\.(?:model\.)?)?(layers\.\d+)\.(?:self_attn|mlp)\."
                     r"((?:experts\.\d+\.)?\w+_proj)\.(qweight|qzeros|zeros|scales|g_idx|weight_packed|weight_scale|"
                     r"weight_zero_point|weight_g_idx|weight)$")
_GROUP_INDEX = ("g_idx", "weight_g_idx")


def _packed_bytes(path: Path) -> dict[str, int]:
    """Ledger tensor name (layers.3.q_proj) → bytes of its packed parts, from the safetensors headers (and group
    indices). A float `weight` is a projection left dense; a group index is not held, and one that interleaves groups
    over the inputs (act-order) has Tally serve the projection dense, so it gets no entry and is priced dense."""
    out: dict[str, int] = {}
    interleaved: set[str] = set()
    for file in sorted(path.glob("*.safetensors")):
        with open(file, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
            for name, info in header.items():
                m = _PACKED.match(name)
                if not m or (m.group(3) == "weight" and info["dtype"] != "I8"):
                    continue
                key = f"{m.group(1)}.{m.group(2)}"
                start, end = info["data_offsets"]
                if m.group(3) not in _GROUP_INDEX:
                    out[key] = out.get(key, 0) + end - start
                elif info["dtype"] == "I32":
                    f.seek(8 + size + start)
                    if _interleaved(array("i", f.read(end - start))):
                        interleaved.add(key)
    return {key: n for key, n in out.items() if key not in interleaved}


def _interleaved(group_of: array) -> bool:
    """Whether a group index [K] is anything but input k in group k // (K / groups), as the int4 layers hold them."""
    k, groups = len(group_of), max(group_of, default=-1) + 1
    return groups == 0 or k % groups != 0 or any(g != i // (k // groups) for i, g in enumerate(group_of))
