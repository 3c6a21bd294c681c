"""What an embedding checkpoint says about its own pooling: sentence-transformers' modules.json (a Pooling module's
mode, a Normalize module) and config.json's Matryoshka flags (vLLM's `is_matryoshka`, `matryoshka_dimensions`).
Reading only: tally/engine/pooling.py turns it into the served pooler config."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# sentence-transformers' Pooling config keys → the pooling type vLLM names the same way
_MODES = {"pooling_mode_lasttoken": "LAST", "pooling_mode_mean_tokens": "MEAN", "pooling_mode_cls_token": "CLS"}
_UNSUPPORTED_MODES = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                      "pooling_mode_weightedmean_tokens")
# v6's pooling_mode values → the same pooling types
_MODE_NAMES = {"lasttoken": "LAST", "mean": "MEAN", "cls": "CLS"}
# modules by class name: sentence_transformers.models.Pooling before v6, ...sentence_transformer.modules.pooling.Pooling
_TRANSFORMER, _POOLING, _NORMALIZE = "Transformer", "Pooling", "Normalize"


@dataclass(frozen=True)
class CheckpointPooling:
    is_sentence_transformers: bool = False  # modules.json: made to be served as an embedding model
    pooling_type: str | None = None  # LAST | MEAN | CLS; None: the checkpoint does not say
    normalize: bool | None = None
    is_matryoshka: bool = False  # trained so that a prefix of the vector is an embedding too
    matryoshka_dimensions: tuple[int, ...] | None = None  # the prefix lengths it was trained for, where it says
    problem: str | None = None  # what in modules.json Tally cannot reproduce (refused where pooling is served)


def checkpoint_pooling(path: Path) -> CheckpointPooling:
    """The pooling a checkpoint folder declares; a GGUF file, or a folder without these files, declares none."""
    if not path.is_dir():
        return CheckpointPooling()
    config = _read(path / "config.json")
    dims = config.get("matryoshka_dimensions")
    matryoshka = dict(is_matryoshka=bool(config.get("is_matryoshka") or dims),
                      matryoshka_dimensions=tuple(dims) if dims else None)
    modules = _read(path / "modules.json", [])
    if not modules:
        return CheckpointPooling(**matryoshka)
    kinds = [m.get("type", "").rsplit(".", 1)[-1] for m in modules]
    extra = [m.get("type") for m, k in zip(modules, kinds) if k not in (_TRANSFORMER, _POOLING, _NORMALIZE)]
    pooling_type, problem = None, None
    if extra:
        problem = f"modules.json has {', '.join(extra)} after the transformer, which Tally does not run"
    pooling = next((m for m, k in zip(modules, kinds) if k == _POOLING), None)
    if pooling is not None:
        settings = _read(path / pooling.get("path", "") / "config.json")
        chosen = [_MODES[k] for k in _MODES if settings.get(k)]
        odd = [k for k in _UNSUPPORTED_MODES if settings.get(k)]
        if "pooling_mode" in settings:
            given = settings["pooling_mode"]
            given = [given] if isinstance(given, str) else list(given)
            chosen = [_MODE_NAMES[g] for g in given if g in _MODE_NAMES]
            odd = [g for g in given if g not in _MODE_NAMES]
        if odd or len(chosen) > 1:
            problem = problem or (f"{pooling.get('path')}/config.json pools with {', '.join(odd + chosen)}; Tally "
                                  "pools one of LAST, MEAN or CLS")
        pooling_type = chosen[0] if len(chosen) == 1 else None
    return CheckpointPooling(True, pooling_type, _NORMALIZE in kinds, problem=problem, **matryoshka)


def max_seq_length(path: Path) -> int | None:
    """sentence_bert_config.json's max_seq_length: the longest input the model was trained for (vLLM's limit too)."""
    return _read(path / "sentence_bert_config.json").get("max_seq_length") if path.is_dir() else None


def _read(path: Path, default: object = None) -> dict | list:
    if not path.is_file():
        return {} if default is None else default
    return json.loads(path.read_text())
