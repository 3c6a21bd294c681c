"""What several test files build the same way (a family's checkpoint, its GGUF), built once per pytest run in the
run's shared directory (tests/conftest.py: run_shared_dir) and reused by every file and pytest-xdist worker that asks
for the same: each build under a file lock, named by a hash of what it is built from."""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path


def key_name(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Holds an exclusive lock on `path` (made if absent) across the run's processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@contextlib.contextmanager
def taken(path: Path) -> Iterator[bool]:
    """Whether this process holds the lock on `path` (made if absent): True if no other held it, else False at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
        else:
            yield True


def built_once(target: Path, build: Callable[[Path], object]) -> Path:
    """`target`, made by build(a fresh directory) by its first caller in the run, then renamed into place, so a
    caller never sees half a build (one left by a failed build is made again)."""
    with locked(target.with_name(target.name + ".lock")):
        if not target.exists():
            partial = target.with_name(target.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            build(partial)
            partial.rename(target)
    return target
