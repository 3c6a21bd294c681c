"""Writes the checkpoint `tally quantize` produces; its format and reader are tally/models/packed_checkpoint.py."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from tally.models.hf_checkpoint import SINGLE_FILE
from tally.models.packed_checkpoint import QUANT_METHOD, pack_int4
from tally.quantize.scheme import STORE_DTYPE, Grid, QuantScheme


def packed_tensors(name: str, q: torch.Tensor, grid: Grid, scheme: QuantScheme) -> dict[str, torch.Tensor]:
    """The on-disk tensors of projection `name` (HF name without `.weight`) from integers q [N, K] on `grid`."""
    if scheme.bits == 4:
        return {f"{name}.qweight": pack_int4(q), f"{name}.scales": grid.scale.to(STORE_DTYPE).contiguous(),
                f"{name}.zeros": grid.zero.to(STORE_DTYPE).contiguous()}
    return {f"{name}.qweight": q.to(torch.int8).contiguous(), f"{name}.scales": grid.scale[:, 0].to(STORE_DTYPE)}


def write_packed(out_dir: Path, hf_config: dict[str, Any], tensors: dict[str, torch.Tensor],
                 quantization_config: dict[str, Any]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    config = dict(hf_config, quantization_config={"quant_method": QUANT_METHOD, **quantization_config})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out_dir / SINGLE_FILE),
              metadata={"format": "pt", "quant_method": QUANT_METHOD})
