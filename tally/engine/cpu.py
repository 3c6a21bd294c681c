"""What this CPU computes fast. bf16 matmul is only fast with AVX-512 BF16 or AMX; on AVX2-only
CPUs PyTorch emulates it and a bf16 decode step runs ~10x slower than fp32 (measured here)."""
from __future__ import annotations

import functools


@functools.cache
def has_fast_bf16() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    return False
