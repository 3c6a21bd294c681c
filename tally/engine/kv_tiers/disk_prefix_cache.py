"""The disk prefix tier (--kv-disk-cache-dir): full KV blocks as files named by their stable key
(tally/core/kv_tiers.py:extend_block_keys), so a prompt prefix seen before, by this process or an earlier one, is
read back instead of recomputed (LMCache's local disk backend, one file per block)."""
from __future__ import annotations

import hashlib
import logging
import os
import queue
import struct
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path

import torch

from tally.attention.kv_blocks import ExactBlocks
from tally.engine.kv_tiers.stats import DiskCacheStats
from tally.errors import ConfigError
from tally.units import MiB

log = logging.getLogger("tally.engine")
MAGIC = b"TALLYKV1"
HEADER = struct.Struct("<8s16s16sQ20s")  # magic, identity, key, payload bytes, payload SHA-1
WRITE_QUEUE_BYTES = 128 * MiB
STALE_TEMP_S = 3600.0  # a temporary file this old was left by a process that died mid-write
_IDENTITY_HEX = 32


class DiskPrefixCache:
    """DIR/<identity>/<key>.kv, where the identity names what the KV values depend on
    (tally/engine/kv_tiers/identity.py): another model, dtype or layout never reads them. A file is written under a
    temporary name and renamed, and read back only if its header (magic, identity, key, length) and its payload's SHA-1
    match: a torn or damaged file is a miss (and is deleted), never a wrong block. The directory is bounded
    (--kv-disk-cache-size): the least recently used files go first, whichever model wrote them. Use is kept in the
    files' mtimes (stamps that only grow: the file system's own clock ticks too coarsely to order a run of blocks), so
    the order survives restarts; a run of blocks read or written together is stamped tail first, so a prefix's tail goes
    before its head, as in the pool's LRU. Nothing in DIR but these folders' .kv and .tmp files is ever deleted.

    Writes leave the engine thread: the blocks are copied out of the pool at once (it may hand them to another request
    next step) and a thread of their own writes them; while WRITE_QUEUE_BYTES of copies wait, further blocks are not
    written (a cache may miss; the engine must not wait on a disk). Reads run on the engine thread, at admission."""
    def __init__(self, root: str | Path, capacity_bytes: int, identity: bytes, codec: ExactBlocks,
                 block_size: int) -> None:
        self.root = Path(root).expanduser()
        self.dir = self.root / identity.hex()
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"kv_disk_cache_dir {str(root)!r} cannot hold the disk prefix cache ({exc}); give a "
                              "folder this process may create and write", param="kv_disk_cache_dir") from exc
        self.identity = identity
        self.codec = codec
        self.block_size = block_size
        self._files = _FileIndex(_scan(self.root), capacity_bytes)
        self._queue: queue.Queue = queue.Queue()
        # The writer holds the index, never the pool: an engine nobody closed is still collected, and its
        # finalizer (also run when the interpreter exits) lets the queued blocks reach the disk first.
        writer = threading.Thread(target=_write_loop, args=(self._queue, self._files, identity), name="tally-kv-disk",
                                  daemon=True)
        writer.start()
        self._finalizer = weakref.finalize(self, _stop_writer, self._queue, writer)

    def _path(self, key: bytes) -> str:
        return os.path.join(self.dir, key.hex() + ".kv")

    def holds(self, key: bytes) -> bool:
        with self._files.lock:
            self._files.stats.queried_tokens += self.block_size
            return self._path(key) in self._files.sizes

    def load(self, keys: list[bytes], block_ids: list[int]) -> int:
        if not keys:
            return 0
        data = torch.empty(len(keys), self.codec.nbytes, dtype=torch.uint8)
        loaded = 0
        while loaded < len(keys) and self._read(keys[loaded], data[loaded]):
            loaded += 1
        for key in reversed(keys[:loaded]):
            self._files.touch(self._path(key))
        if loaded:
            self.codec.write(torch.tensor(block_ids[:loaded]), data[:loaded])
            with self._files.lock:
                self._files.stats.hit_tokens += loaded * self.block_size
        return loaded

    def _read(self, key: bytes, out: torch.Tensor) -> bool:
        path = self._path(key)
        view = memoryview(out.numpy())
        try:
            with open(path, "rb") as f:
                magic, identity, own_key, length, digest = HEADER.unpack(f.read(HEADER.size))
                ok = ((magic, identity, own_key, length) == (MAGIC, self.identity, key, self.codec.nbytes)
                      and f.readinto(view) == length and not f.read(1) and hashlib.sha1(view).digest() == digest)
        except FileNotFoundError:  # evicted by another process sharing the directory
            self._files.drop(path, damaged=False)
            return False
        except (OSError, struct.error):
            ok = False
        if not ok:
            self._files.drop(path, damaged=True)
            return False
        return True

    def store(self, keys: list[bytes], block_ids: list[int]) -> None:
        fresh = self._files.reserve([(k, self._path(k)) for k in keys], self.codec.nbytes)
        fresh.reverse()  # written tail first
        if fresh:
            data = self.codec.read(torch.tensor([block_ids[i] for i in fresh]))
            self._queue.put(([(keys[i], self._path(keys[i])) for i in fresh], data))

    def flush(self) -> None:
        """Wait until every block handed to store() is on disk (or failed to be)."""
        self._queue.join()

    def close(self) -> None:
        """Write what is queued, then stop the writer; later blocks are not kept."""
        self._files.closed = True
        self._finalizer()

    def snapshot(self) -> DiskCacheStats:
        with self._files.lock:
            return replace(self._files.stats, num_files=len(self._files.sizes))


class _FileIndex:
    """The tier's files and counters, shared by the engine thread and the writer under one lock."""

    def __init__(self, sizes: OrderedDict[str, int], capacity_bytes: int) -> None:
        self.lock = threading.Lock()
        self.sizes = sizes  # path -> bytes, least recently used first, every model's
        self.pending: set[str] = set()  # paths queued for writing
        self.queued_bytes = 0
        self.closed = False
        self._last_stamp = 0
        self.stats = DiskCacheStats(capacity_bytes=capacity_bytes, held_bytes=sum(sizes.values()))
        self.evict()  # the cap may be smaller than the last run's

    def reserve(self, named: list[tuple[bytes, str]], nbytes: int) -> list[int]:
        """Which of these blocks to write: those neither on disk nor queued, while the queue has room."""
        with self.lock:
            fresh = [i for i, (_, path) in enumerate(named) if path not in self.pending and path not in self.sizes]
            room = 0 if self.closed else max(0, WRITE_QUEUE_BYTES - self.queued_bytes) // nbytes
            self.stats.dropped_writes += max(0, len(fresh) - room)
            fresh = fresh[:room]
            self.pending.update(named[i][1] for i in fresh)
            self.queued_bytes += len(fresh) * nbytes
        return fresh

    def written(self, path: str, size: int | None) -> int:
        """One queued block is done: on disk with `size` bytes, or not written (None); the write errors so far."""
        if size is not None:
            self._stamp(path)
        with self.lock:
            self.pending.discard(path)
            if size is None:
                self.stats.write_errors += 1
                return self.stats.write_errors
            self.stats.held_bytes += size - self.sizes.pop(path, 0)
            self.sizes[path] = size
            self.stats.written_blocks += 1
        self.evict()
        return self.stats.write_errors

    def unqueue(self, nbytes: int) -> None:
        with self.lock:
            self.queued_bytes -= nbytes

    def touch(self, path: str) -> None:
        """Most recently used, for this process's eviction and the next one's scan."""
        self._stamp(path)
        with self.lock:
            if path in self.sizes:
                self.sizes.move_to_end(path)

    def _stamp(self, path: str) -> None:
        with self.lock:
            self._last_stamp = max(time.time_ns(), self._last_stamp + 1)
            stamp = self._last_stamp
        try:
            os.utime(path, ns=(stamp, stamp))
        except OSError:
            pass

    def drop(self, path: str, damaged: bool) -> None:
        with self.lock:
            self.stats.held_bytes -= self.sizes.pop(path, 0)
            self.stats.damaged_files += damaged
        if damaged:
            _unlink(path)

    def evict(self) -> None:
        """The least recently used files, until the directory fits its cap."""
        while True:
            with self.lock:
                if self.stats.held_bytes <= self.stats.capacity_bytes or not self.sizes:
                    return
                path, size = self.sizes.popitem(last=False)
                self.stats.held_bytes -= size
            _unlink(path)


def _write_loop(q: queue.Queue, files: _FileIndex, identity: bytes) -> None:
    while True:
        item = q.get()
        if item is None:
            q.task_done()
            return
        named, data = item
        for (key, path), row in zip(named, data):
            try:
                files.written(path, _write(path, identity, key, row.numpy()))
            except OSError as exc:
                if files.written(path, None) == 1:
                    log.warning("disk prefix cache: cannot write %s (%s); blocks that fail to write are recomputed "
                                "when next needed (counted in /ledger's write_errors)", path, exc)
        files.unqueue(data.numel())
        q.task_done()


def _write(path: str, identity: bytes, key: bytes, payload) -> int:
    """Header and payload under a temporary name, then renamed: a reader sees the whole file or none. Its size."""
    temp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(temp, "wb") as f:
            f.write(HEADER.pack(MAGIC, identity, key, payload.nbytes, hashlib.sha1(payload).digest()))
            f.write(payload)
        os.replace(temp, path)
    except OSError:
        _unlink(temp)
        raise
    return HEADER.size + payload.nbytes


def _scan(root: Path) -> OrderedDict[str, int]:
    """Every tier file under root (least recently used first); stale temporary files are deleted."""
    found, now = [], time.time()
    for folder in root.iterdir():
        if not (folder.is_dir() and len(folder.name) == _IDENTITY_HEX and _is_hex(folder.name)):
            continue
        for entry in os.scandir(folder):
            try:
                st = entry.stat()
            except OSError:
                continue
            if entry.name.endswith(".kv"):
                found.append((st.st_mtime_ns, entry.path, st.st_size))
            elif entry.name.endswith(".tmp") and now - st.st_mtime > STALE_TEMP_S:
                _unlink(entry.path)
    return OrderedDict((path, size) for _, path, size in sorted(found))


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _stop_writer(q: queue.Queue, writer: threading.Thread) -> None:
    if writer.is_alive():
        q.put(None)
        writer.join()
