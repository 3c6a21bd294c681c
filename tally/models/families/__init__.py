"""The model families Tally reads, one small file each, and the one lookup from a checkpoint's architecture name
to its family. A new family is a Family (family.py) listed here."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tally.errors import ModelLoadError
from tally.models.config import ModelConfig
from tally.models.families.family import Family
from tally.models.families.gemma import GEMMA2, GEMMA3
from tally.models.families.gpt_oss import GPT_OSS
from tally.models.families.granite import GRANITE
from tally.models.families.llama import LLAMA, MISTRAL
from tally.models.families.mixtral import MIXTRAL
from tally.models.families.multimodal import is_multimodal, text_config
from tally.models.families.olmo import OLMO2, OLMOE
from tally.models.families.phi3 import PHI3
from tally.models.families.qwen import QWEN2, QWEN3, QWEN3_MOE
from tally.models.families.smollm3 import SMOLLM3

FAMILIES: tuple[Family, ...] = (LLAMA, MISTRAL, QWEN2, QWEN3, QWEN3_MOE, GEMMA2, GEMMA3, PHI3, GRANITE, OLMO2,
                                OLMOE, SMOLLM3, MIXTRAL, GPT_OSS)
_BY_NAME = {f.name: f for f in FAMILIES}
_BY_HF = {arch: f for f in FAMILIES for arch in f.hf_architectures}
_BY_GGUF = {arch: f for f in FAMILIES for arch in f.gguf_architectures}

__all__ = ["FAMILIES", "Family", "family", "gguf_family", "hf_config", "read_hf_config"]


def family(name: str) -> Family:
    """The family of a ModelConfig.architecture."""
    return _BY_NAME[name]


def hf_config(cfg: dict[str, Any]) -> ModelConfig:
    """A config.json's contents → ModelConfig, or a ModelLoadError naming the architecture and what Tally reads.
    A multimodal checkpoint reads as the text model it wraps."""
    if is_multimodal(cfg):
        cfg = text_config(cfg)
    archs = cfg.get("architectures") or []
    name = archs[0] if archs else cfg.get("model_type", "?")
    found = _BY_HF.get(name)
    if found is None:
        raise ModelLoadError(f"unsupported architecture {name!r}; Tally reads {', '.join(sorted(_BY_HF))}")
    try:
        return found.config_from_hf(cfg)
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"config.json of this {found.name} model has a missing or malformed field "
                             f"({type(exc).__name__}: {exc})") from exc


def read_hf_config(path: str | Path) -> ModelConfig:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ModelLoadError(f"no config.json at {path}") from exc
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{path} is not valid JSON: {exc}") from exc
    return hf_config(data)


def gguf_family(arch: str, where: str) -> Family:
    found = _BY_GGUF.get(arch)
    if found is None:
        raise ModelLoadError(f"{where} holds a {arch!r} model; Tally reads GGUF architectures "
                             f"{', '.join(sorted(_BY_GGUF))}")
    return found
