"""What this machine offers, asked in one place: the CPU's instruction sets and the memory left.

Every path that picks a kernel or a dtype by the CPU asks here (tally/native/library.py, tally/quant/dispatch.py,
EngineConfig.model_dtypes), so the answer cannot differ between them. Why the flags matter:
- bf16 matmul is fast only with AVX-512 BF16 or AMX; on AVX2-only CPUs PyTorch emulates it and a bf16 decode step
  runs ~10x slower than fp32 (measured on the development machine);
- `torch._int_mm` is a scalar loop without VNNI or AMX (~70x slower than fp32 there);
- Tally's native kernels (tally/native/kernels.c) need AVX2 with FMA and F16C.
The flags come from /proc/cpuinfo; where it cannot be read (not Linux), no fast path is assumed.
"""
from __future__ import annotations

import functools
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
MEMINFO = Path("/proc/meminfo")


@functools.cache
def cpu_flags() -> frozenset[str]:
    try:
        for line in CPUINFO.read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def has_avx2() -> bool:
    return {"avx2", "fma", "f16c"} <= cpu_flags()


def has_fast_bf16() -> bool:
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})


def has_fast_int8_matmul() -> bool:
    return bool(cpu_flags() & {"avx512_vnni", "avx_vnni", "amx_int8"})


def total_ram_bytes(meminfo: Path = MEMINFO) -> int:
    return _meminfo_bytes("MemTotal", meminfo)


def available_ram_bytes(meminfo: Path = MEMINFO) -> int:
    """What the engine may still take (its default KV budget is a fraction of this)."""
    return _meminfo_bytes("MemAvailable", meminfo)


def _meminfo_bytes(field: str, meminfo: Path) -> int:
    for line in meminfo.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024  # the kernel writes kB meaning KiB
    raise OSError(f"no {field} line in {meminfo}")
