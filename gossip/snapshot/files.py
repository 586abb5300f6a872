"""Snapshots on disk: a manifest file (msgpack) and a data file (the flat byte space of the
layout) per snapshot, or per shard, written so that a crash at any point leaves the previous
snapshot or the new one readable, never a mix, and read so that a torn or corrupted file is an
error that names it.

    dir/snapshot.msgpack          {"manifest": ..., "digest": ..., "data": NAME, "bytes": N}
    dir/snapshot-<16 hex>.bin     the arrays back to back
    dir/shard-3.msgpack, dir/shard-3-<16 hex>.bin       save(dir, shard=3)

The data file, named after the snapshot's digest, is written first (temp name, fsync,
rename); the manifest, renamed over the old one, is the commit. Until then the old manifest
names the old data file, which is still there; after it, data files that no manifest names
are removed. One writer per file name at a time.
"""
from __future__ import annotations

import os
import re
import secrets
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

from gossip.errors import SnapshotCorrupt, SnapshotError
from gossip.snapshot import manifest as mf
from gossip.snapshot.array_specs import allocate, byte_view, digest_of, verify
from gossip.snapshot.layout import Layout

__all__ = ["write", "read", "base_name"]

_HEAD_KEYS = {"manifest", "digest", "data", "bytes"}
# A manifest file is small (names, shapes, digests); anything larger is not one of ours.
_MAX_HEAD_BYTES = 64 << 20
# Reads go in pieces: one read() syscall returns at most about 2 GiB.
_READ_BYTES = 64 << 20


def base_name(shard: int | None) -> str:
    """"snapshot", or "shard-<rank>" for one rank's own."""
    if shard is None:
        return "snapshot"
    if isinstance(shard, bool) or not isinstance(shard, int) or shard < 0:
        raise ValueError(f"shard must be a non-negative int (a rank) or None, got {shard!r}")
    return f"shard-{shard}"


def write(directory: str, shard: int | None, views: Sequence[memoryview],
          manifest_of: Callable[[], dict]) -> str:
    """Write ``views`` (the flat space, in order) and the manifest ``manifest_of()`` returns
    (it may hash the same views: it runs in a thread beside the writing, both releasing the
    GIL); returns the manifest file's path."""
    base = base_name(shard)
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{base}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    path = os.path.join(directory, f"{base}.msgpack")
    try:
        with ThreadPoolExecutor(1, thread_name_prefix="snapshot-save") as pool:
            pending = pool.submit(manifest_of)
            total = _write_file(tmp, views)
            manifest = pending.result()
        digest = mf.digest(manifest)
        data_name = f"{base}-{digest[:16]}.bin"
        os.replace(tmp, os.path.join(directory, data_name))
        _fsync_directory(directory)   # the data's name is durable before the commit
        _write_file(tmp, [memoryview(mf.pack({"manifest": manifest, "digest": digest,
                                              "data": data_name, "bytes": total}))])
        os.replace(tmp, path)
        _fsync_directory(directory)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    _remove_stale(directory, base, data_name)
    return path


def read(directory: str, shard: int | None) -> tuple[list, list, list[str], dict, int]:
    """(specs, arrays, digests, parts, format version) of the snapshot saved under
    ``directory``, every check passed (each array's digest in its version's scheme: a
    version-2 file's CRC-32s too): FileNotFoundError if there is none, SnapshotCorrupt for a
    torn or corrupted file (naming the file, or the first tensor whose bytes are wrong)."""
    base = base_name(shard)
    path = os.path.join(directory, f"{base}.msgpack")
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_HEAD_BYTES + 1)
    except FileNotFoundError:
        raise FileNotFoundError(f"no snapshot at {path}{_what_is_there(directory)}") from None
    try:
        head = mf.unpack(raw, path)
    except SnapshotError as exc:
        raise SnapshotCorrupt(f"{path} is torn or corrupted: {exc}") from exc
    if not isinstance(head, dict) or set(head) != _HEAD_KEYS:
        raise SnapshotCorrupt(f"{path} is not a snapshot manifest file (torn or corrupted)")
    manifest, digest = head["manifest"], head["digest"]
    if not isinstance(digest, str) or mf.digest(manifest) != digest:
        raise SnapshotCorrupt(f"{path}: the manifest does not match its digest (corrupted)")
    specs, digests, parts = mf.parse(manifest)
    version = mf.version_of(manifest)
    layout = Layout.of([s.name for s in specs], [s.nbytes for s in specs])
    data_name = f"{base}-{digest[:16]}.bin"
    if head["data"] != data_name or head["bytes"] != layout.total:
        raise SnapshotCorrupt(f"{path}: the data file's name or size disagrees with the "
                              "manifest (corrupted)")
    data_path = os.path.join(directory, data_name)
    try:
        size = os.path.getsize(data_path)
    except FileNotFoundError:
        raise SnapshotCorrupt(f"{path} names the data file {data_path}, which is missing") \
            from None
    if size != layout.total:
        raise SnapshotCorrupt(f"{data_path} holds {size} bytes where its manifest says "
                              f"{layout.total}: a torn or truncated file")
    arrays = [allocate(s) for s in specs]
    views = [byte_view(a) for a in arrays]
    # Each array is hashed in a thread as soon as it is read, while the next one is read.
    with ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="snapshot-load") as pool, \
            open(data_path, "rb", buffering=0) as f:
        pending = []
        for spec, view in zip(specs, views):
            _read_into(f, view, data_path)
            pending.append(pool.submit(digest_of, spec, view, version))
        got = [p.result() for p in pending]
    verify(specs, got, digests, layout.offsets, f"file {data_path}")
    return specs, arrays, digests, parts, version


def _write_file(path: str, views: Sequence[memoryview]) -> int:
    total = 0
    with open(path, "wb", buffering=0) as f:
        for view in views:
            while view:   # a raw write may take less than it was given
                n = f.write(view)
                total += n
                view = view[n:]
        os.fsync(f.fileno())
    return total


def _read_into(f: Any, view: memoryview, path: str) -> None:
    at = 0
    while at < len(view):
        n = f.readinto(view[at:at + _READ_BYTES])
        if not n:   # the file shrank since its size was checked
            raise SnapshotCorrupt(f"{path} ended early: a torn or truncated file")
        at += n


def _fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_stale(directory: str, base: str, keep: str) -> None:
    """Data files of ``base`` no manifest names any more, and temp files of crashed saves."""
    pattern = re.compile(rf"{re.escape(base)}-[0-9a-f]{{16}}\.bin|"
                         rf"\.{re.escape(base)}\.[0-9]+\.[0-9a-f]{{8}}\.tmp")
    for name in os.listdir(directory):
        if name != keep and pattern.fullmatch(name):
            try:
                os.unlink(os.path.join(directory, name))
            except FileNotFoundError:
                pass


def _what_is_there(directory: str) -> str:
    try:
        found = sorted(n[:-len(".msgpack")] for n in os.listdir(directory)
                       if re.fullmatch(r"snapshot\.msgpack|shard-[0-9]+\.msgpack", n))
    except FileNotFoundError:
        return " (no such directory)"
    return f" (the directory holds: {', '.join(found)})" if found else ""
