"""One name for everything the KV values of a block depend on besides its tokens: the disk prefix tier's folder
(tally/engine/kv_tiers/disk_prefix_cache.py), so a block another model, path or layout computed is never read as this
one's.

The checkpoints are named by their files' paths, sizes and modification times (hashing gigabytes of weights at each
start would cost more than the tier saves); the rest by what changes the values: the projections' path (compute
dtype, quantization, the row count from which prefill steps run in bf16), every pool tensor's dtype and per-block
shape (KV dtype, block size, heads, layers), int8 key smoothing's measured scales, and the
versions of Tally and torch."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from tally.version import __version__


def kv_identity(checkpoints: list[Path], settings: dict, scales: list[torch.Tensor]) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for checkpoint in checkpoints:
        files = sorted(p for p in checkpoint.iterdir() if p.is_file()) if checkpoint.is_dir() else [checkpoint]
        for f in files:
            st = f.stat()
            h.update(f"{f.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    h.update(json.dumps({**settings, "tally": __version__, "torch": torch.__version__}, sort_keys=True,
                        default=str).encode())
    for s in scales:
        h.update(s.detach().float().contiguous().numpy().tobytes())
    return h.digest()


def key_smoothing_scales(model: torch.nn.Module) -> list[torch.Tensor]:
    """The int8 cache's per-layer key scales (tally/models/key_smoothing.py), empty when it is off."""
    return [m.key_scale for m in model.modules() if getattr(m, "key_scale", None) is not None]
