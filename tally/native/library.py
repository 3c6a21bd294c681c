"""Builds tally/native/kernels.c with the machine's C compiler on first use and loads it with ctypes, its functions
typed.

The shared object is cached under $XDG_CACHE_HOME/tally (default ~/.cache/tally), named by a hash of the sources and
flags, so an edit rebuilds; processes that start together compile it once, and none loads a half-written file.
`load()` returns None — callers keep their PyTorch paths — when TALLY_NATIVE=0, when the CPU lacks AVX2 (FMA and F16C
come with it on every x86 CPU that has it), or when no compiler is found; the reason is logged once. A C file and the
system compiler rather than a torch C++ extension: it needs no Python headers and no torch build toolchain.
"""
from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tally.platform import cache_dir, cpu_flags, has_avx2

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("kernels.c")
# SOURCE includes them (pyproject.toml's package data ships them): the kernels' own threads, the KV cache's value
# formats, vector math, the integer projections and their formats' dot products, the fp16 panels, the gated
# activation, paged decode and prompt attention, the sampler, any projection's dispatch, a mixture of experts' MLP,
# LoRA adapters' deltas; AMX's tiles (int_tiles.h includes them in an AMX build)
HEADERS = [Path(__file__).with_name(name)
           for name in ("pool.h", "kv_rows.h", "vec_math.h", "int_tiles.h", "int_dots.h", "amx_tiles.h", "gemm_f16.h",
                        "gated.h", "decode_attention.h", "prefill_attention.h", "sampling.h", "project.h",
                        "experts.h", "lora_delta.h")]
FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-pthread", "-fPIC", "-shared", "-Wall"]

# The C prototypes' argument and result types, by hand: tests/test_native_mirrors.py holds them to the C text
_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
SIGNATURES = {
    "tally_gemm_q4": [_P, _P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I, ctypes.c_int, ctypes.c_int],
    "tally_gemm_q8": [_P, _P, _P, _P, _P, _I, _I, _I, _I, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int],
    "tally_gemm_f16": [_P, _P, _P, _P, _I, _I, _I, ctypes.c_int],
    "tally_gemm_f32": [_P, _P, _P, _P, _I, _I, _I, ctypes.c_int],
    "tally_gemm_bf16": [_P, _P, _P, _P, _I, _I, _I, ctypes.c_int],
    "tally_rms_norm": [_P, _P, _P, _I, _I, _F],
    "tally_gated_mul": [_P, _P, _I, _I, ctypes.c_int, _F, _F],
    "tally_softcap_rows": [_P, _P, _I, _I, _F],
    "tally_read_bytes": [_P, _I, _P],
    "tally_rope_store": [_P, _I, _I, _P, _P, _I, _F, _P, _P, _I, _I, _I, _I, _P, _P, _P, ctypes.c_int],
    "tally_rope_store_q8": [_P, _I, _I, _P, _P, _I, _F, _P, _P, _I, _I, _I, _I, _P, _P, _P, _P, _P, _P, _P],
    "tally_decode_layers": [_P, _P, _I, _P, _P, _P, _P, _I, _P, _P, _I, _P],
    "tally_decode_greedy": [_P, _I, _P, _P, _P, _I, _P, _I, _P, _P, _P],
    "tally_experts": [_P, _P, _I, _P],
    "tally_lora_add": [_P, _I, _P, _P, _I],
    "tally_decode_attention": [_P, _I, _P, _P, ctypes.c_int, _P, _I, _P, _I, _I, _I, _I, _I, _I, _F, _F, _P, _P],
    "tally_decode_attention_q8": [_P, _I, _P, _P, _P, _P, _P, _I, _P, _I, _I, _I, _I, _I, _I, _F, _F, _P, _P],
    "tally_prefill_attention": [_P, _I, _P, _P, ctypes.c_int, _P, _I, _I, _I, _I, _I, _I, _I, _F, _F, _P, _P],
    "tally_dequant_q4_bf16": [_P, _P, _P, _P, _P, _I, _I, _I, _I, ctypes.c_int],
    "tally_dequant_q8_bf16": [_P, _P, _P, _I, _I, _I, ctypes.c_int],
    "tally_dequant_f16_bf16": [_P, _P, _I, _I],
    "tally_argmax_rows": [_P, _I, _I, _P],
    "tally_sample_rows": [_P, _P, _I, _I, _P, _P, _P],
    "tally_top_rows": [_P, _P, _I, _I, _I, _P, _P, _P, _P],
    "tally_logsumexp_rows": [_P, _P, _I, _I, _P, _P],
    "tally_dequant_q4_rows": [_P, _P, _P, _P, _P, _I, _I, _I, _I, _I, ctypes.c_int, _P],
    "tally_dequant_q8_rows": [_P, _P, _P, _I, _I, _I, _I, ctypes.c_int, _P],
    "tally_pool_helper_pieces": [],
    "tally_amx_init": [],
}
RESULTS = {name: _I for name in ("tally_argmax_rows", "tally_dequant_q4_rows",
                                  "tally_dequant_q8_rows", "tally_decode_layers", "tally_decode_greedy",
                                  "tally_pool_helper_pieces", "tally_amx_init")}  # the others return void


def _unavailable_reason() -> str | None:
    if os.environ.get("TALLY_NATIVE", "1") == "0":
        return "TALLY_NATIVE=0"
    if not has_avx2():
        return "the CPU lacks AVX2 with FMA and F16C (tally/platform.py)"
    if not (os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")):
        return "no C compiler (cc/gcc) on PATH"
    return None


def builds() -> dict[str, list[str]]:
    """Every build of the same source this CPU runs, by name, narrowest first: its flags on top of FLAGS. avx512:
    AVX-512 with VNNI (kernels.c: TALLY_AVX512, 64-byte integer dot products); avx512_gfni: that with GFNI's bit moves
    for the high bits of int5 / int6 (int_dots.h: high_bits512); avx512_amx: that with AMX's int8 tiles for 16 rows
    at a time (amx_tiles.h); vnni256: AVX-VNNI, or AVX-512 VNNI on 32-byte vectors (TALLY_VNNI)."""
    flags, found = cpu_flags(), {"avx2": []}
    if "avx_vnni" in flags:
        found["vnni256"] = ["-mavxvnni"]
    elif {"avx512_vnni", "avx512vl"} <= flags:
        found["vnni256"] = ["-mavx512vnni", "-mavx512vl"]
    if {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= flags:
        found["avx512"] = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"]
        if "gfni" in flags:
            found["avx512_gfni"] = found["avx512"] + ["-mgfni"]
            if {"amx_tile", "amx_int8"} <= flags and _amx_granted():
                found["avx512_amx"] = found["avx512_gfni"] + ["-mamx-tile", "-mamx-int8"]
    return found


@functools.cache
def _amx_granted() -> bool:
    """Whether Linux lends this process AMX's tile registers (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA, Linux
    5.16+): without them the first tile instruction dies with SIGILL. The grant is the process's, so asking here grants
    the build's tiles too (amx_tiles.h: tally_amx_init asks again, and only a granted build runs them)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(158, 0x1023, 18) == 0  # SYS_arch_prctl (x86-64), ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
    except (OSError, AttributeError):
        return False


def build_wanted() -> str:
    """The widest build, or the one TALLY_NATIVE_ISA names (avx2, vnni256, avx512, avx512_gfni, avx512_amx: for A/B
    measurements)."""
    found = builds()
    wanted = os.environ.get("TALLY_NATIVE_ISA", "")
    return wanted if wanted in found else list(found)[-1]


def build_name() -> str | None:
    """The name (builds()) of the build load() returns, or None with the kernels off: the path measurement's cache
    key and the start-up ledger carry it, since each build times differently."""
    lib = load()
    return None if lib is None else lib.isa


def build_digest() -> str | None:
    """The hash of the loaded build's sources and flags (None with the kernels off): a path measured on other
    kernels (an older Tally's) is measured again."""
    lib = load()
    return None if lib is None else lib.digest


def _build_once(target: Path, flags: list[str]) -> None:
    """Builds `target` unless a process that held the lock before this one did: processes that start together (a
    server's tensor-parallel ranks, several servers on one machine, a test run's workers) wait for one compile, a
    minute on two cores, instead of each running its own beside the others."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            _build(target, flags)


def _build(target: Path, flags: list[str]) -> None:
    compiler = os.environ.get("CC") or shutil.which("cc") or "gcc"
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        partial = Path(tmp) / target.name
        subprocess.run([compiler, *flags, "-o", str(partial), str(SOURCE), "-lm"],
                       check=True, capture_output=True, text=True)
        os.replace(partial, target)  # atomic: a concurrent loader sees the old state or the whole file


def load_build(flags: list[str]) -> ctypes.CDLL:
    """The build of SOURCE with FLAGS + `flags` (compiled on first use), its functions typed."""
    code = b"".join(path.read_bytes() for path in [SOURCE, *HEADERS])
    digest = hashlib.sha256(code + " ".join(FLAGS + flags).encode()).hexdigest()[:16]
    target = cache_dir() / f"tally_kernels_{digest}.so"
    if not target.exists():
        _build_once(target, FLAGS + flags)
    lib = ctypes.CDLL(str(target))
    lib.digest = digest
    for name, argtypes in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, RESULTS.get(name)
    lib.tally_amx_init()  # an AMX build's tiles on (builds() lists one only where they are granted); else nothing
    return lib


@functools.cache
def load() -> ctypes.CDLL | None:
    reason = _unavailable_reason()
    if reason is None:
        try:
            found = builds()
            names = list(found)
            names = names[:names.index(build_wanted()) + 1]
            while True:  # an older compiler without the wider flags still builds a narrower one
                name = names.pop()
                try:
                    lib = load_build(found[name])
                    lib.isa = name
                    break
                except (OSError, subprocess.CalledProcessError) as e:
                    if not names:
                        raise
                    log.warning("native kernels: the %s build failed (%s); trying %s", name,
                                (getattr(e, "stderr", "") or str(e)).strip()[:200], names[-1])
        except (OSError, subprocess.CalledProcessError) as e:
            detail = getattr(e, "stderr", "") or str(e)
            reason = f"building {SOURCE.name} failed: {detail.strip()[:500]}"
    if reason is not None:  # asked for: info; otherwise the user is losing speed and should hear why
        level = logging.INFO if reason == "TALLY_NATIVE=0" else logging.WARNING
        log.log(level, "native CPU kernels off (%s); using PyTorch kernels", reason)
        return None
    return lib
