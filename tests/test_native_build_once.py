"""Processes that start together into an empty cache (a server's parallel ranks, several servers, a test run's
workers) compile the native kernels once: the others wait for that build and load it."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest

from tally.platform import cache_dir, has_avx2

COMPILE_SECONDS = 4  # the stand-in compiler's own time: longer than the processes' starts lie apart


@pytest.mark.skipif(not has_avx2(), reason="this CPU lacks AVX2: the native kernels are not built here")
def test_processes_starting_together_compile_the_kernels_once(tmp_path):
    """The compiler is a stand-in that counts its runs and copies the build this run already compiled (the same
    source and flags: a real compile is a minute on two cores per process and would check nothing more)."""
    from tally.native.library import load

    session_build = cache_dir() / f"tally_kernels_{load().digest}.so"
    runs = tmp_path / "compiler-runs"
    compiler = tmp_path / "cc"
    compiler.write_text(f"#!/bin/sh\necho run >> {shlex.quote(str(runs))}\nsleep {COMPILE_SECONDS}\n"
                        f'while [ "$1" != -o ]; do shift; done\n'  # any other build fails, as gcc can
                        f'[ "$(basename "$2")" = {session_build.name} ] && cp {shlex.quote(str(session_build))} "$2"\n')
    compiler.chmod(0o755)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "CC": str(compiler)}
    code = "from tally.native.library import load; print(load().digest)"
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(3)]
    results = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err[-2000:] for _, err in results]
    assert [out.strip() for out, _ in results] == [load().digest] * 3
    assert runs.read_text().split() == ["run"]
