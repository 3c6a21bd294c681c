"""What this machine offers, asked in one place: the CPU's instruction sets, the memory left, the C library's calls.

Every path that picks a kernel or a dtype by the CPU asks here (tally/native/library.py, tally/quant/dispatch.py,
EngineConfig.path_candidates), so the answer cannot differ between them; which of the possible paths is fastest
is then measured, not inferred from the flags (tally/engine/startup/path_tuning.py). Why the flags matter:
- bf16 matmul is fast only with AVX-512 BF16 or AMX; on AVX2-only CPUs PyTorch emulates it, many times slower
  than fp32 (docs/benchmarks.md#paths-chosen-by-measurement);
- `torch._int_mm` is a scalar loop without VNNI or AMX, far slower than fp32;
- Tally's native kernels (tally/native/kernels.c) need AVX2 with FMA and F16C.
The flags come from /proc/cpuinfo; where it cannot be read (not Linux), no fast path is assumed.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import re
from collections.abc import Callable
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
MEMINFO = Path("/proc/meminfo")


@functools.cache
def libc_function(name: str) -> Callable | None:
    """A C library function Python does not wrap (malloc_trim, madvise), or None where there is none (musl lacks
    malloc_trim; macOS and Windows have no libc.so)."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True), name)
    except (OSError, AttributeError):
        return None


@functools.cache
def cpu_flags() -> frozenset[str]:
    try:
        for line in CPUINFO.read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@functools.cache
def cpu_model() -> str:
    """The CPU's model name ("" where /proc/cpuinfo cannot be read): part of the key of measured choices."""
    try:
        for line in CPUINFO.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def physical_cores() -> int:
    """Physical cores among the CPUs this process may run on (hyper-threads share a core's units, so a
    second thread per core mostly waits): the default thread count of the model's kernels."""
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    cores, cpu, package = set(), None, "0"
    try:
        for line in CPUINFO.read_text().splitlines():
            name, _, value = line.partition(":")
            name, value = name.strip(), value.strip()
            if name == "processor":
                cpu = int(value)
            elif name == "physical id":
                package = value
            elif name == "core id" and cpu in allowed:
                cores.add((package, value))
    except OSError:
        pass
    return max(len(cores), 1) if cores else max(len(allowed), 1)


def parse_cpu_list(text: str) -> set[int]:
    """"0-3,6" -> {0, 1, 2, 3, 6} (the kernel's cpulist format, as taskset -c takes it)."""
    cpus: set[int] = set()
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:-(\d+))?\s*", part)
        if not match or (match[2] is not None and int(match[2]) < int(match[1])):
            raise ValueError(f"CPU list {text!r}: write CPUs as 0-3,6")
        cpus.update(range(int(match[1]), int(match[2] or match[1]) + 1))
    return cpus


def pin_process(cpus: set[int]) -> None:
    """Every thread of this process (OpenMP's pool may exist already) onto `cpus`; threads made later inherit."""
    tasks = Path("/proc/self/task")
    for tid in (int(t) for t in os.listdir(tasks)) if tasks.exists() else (0,):
        os.sched_setaffinity(tid, cpus)


def cache_dir() -> Path:
    """Where Tally keeps what it built or measured for this machine: $XDG_CACHE_HOME/tally (~/.cache/tally)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tally"


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
