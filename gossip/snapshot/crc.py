"""Checksums of snapshot pieces on every core: XXH3-64 (xxhash; snapshot format version 3) a
piece per thread, and zlib's CRC-32 (version 2) in parts whose sums are combined.

The pool's threads start once (``warm``): starting a thread costs 0.1 ms on a quiet machine
and was measured at 0.5-3.7 ms on a loaded one, on the critical path of a 4 MiB transfer.

XXH3 hashes a 4 MiB piece (array_specs.PIECE_BYTES) in about a quarter of a millisecond on one
core here (~17 GB/s, out of cache): a piece is one task (``xxh3``), and XXH3 has no way to
join the hashes of parts, so a piece written in parts in order is hashed part by part as they
come, in the writer's thread (``Xxh3Stream``).

zlib's CRC-32, which version-2 snapshots and checkpoints carry, sums at ~2-4 GB/s on one core
of this project's 2-core machine: a buffer is cut into SPLIT_BYTES parts summed at once by the
pool (zlib releases the GIL), and the parts' CRCs are joined by ``combine``: CRC(A || B) from
CRC(A), CRC(B) and len(B) alone (zlib's crc32_combine, which Python's zlib does not expose:
CRC(A) times x^(8 len B) modulo the polynomial, plus CRC(B)).

    pending = xxh3(piece)                # version 3: hashed in a thread
    value = pending.result()             # == xxhash.xxh3_64_intdigest(piece)
    pending = checksum(view)             # version 2: the parts are being summed
    crc = pending.result()               # == zlib.crc32(view)
    crc_ab = combine(crc_a, crc_b, len_b)
"""
from __future__ import annotations

import os
import threading
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import xxhash

__all__ = ["checksum", "combine", "xxh3", "warm", "workers", "PendingCrc", "PendingXxh3",
           "Xxh3Stream", "SPLIT_BYTES", "THREAD_PREFIX"]

#: Parts of a buffer summed apart. Small enough that a 4 MiB piece keeps every core busy, large
#: enough that a part's hand-off (~20 us) is noise against its sum (~0.25 ms).
SPLIT_BYTES = 1 << 20
#: The pool's threads' names start so: one pool per process, started once, never stopped
#: (idle threads cost nothing; every peer of the process shares them).
THREAD_PREFIX = "gossip-crc"
_POLY = 0xEDB88320   # CRC-32's polynomial, bit-reflected (zlib's)


def _multiply(a: int, b: int) -> int:
    """a * b modulo the CRC polynomial, both bit-reflected (zlib's multmodp)."""
    m, p = 1 << 31, 0
    while True:
        if a & m:
            p ^= b
            if a & (m - 1) == 0:
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


def _powers() -> list[int]:
    """x^(2^k) modulo the polynomial for k = 0..31 (zlib's x2n_table)."""
    out, p = [], 1 << 30   # x^1
    for _ in range(32):
        out.append(p)
        p = _multiply(p, p)
    return out


_X2N = _powers()


def _x_to_8n(n: int) -> int:
    """x^(8 n) modulo the polynomial: what CRC(A) is multiplied by when n bytes follow A."""
    p, k = 1 << 31, 3   # x^0; 8 n = n * 2^3
    while n:
        if n & 1:
            p = _multiply(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return p


def combine(crc_a: int, crc_b: int, length_b: int) -> int:
    """zlib.crc32(A + B) from zlib.crc32(A), zlib.crc32(B) and len(B) (tens of microseconds)."""
    if length_b <= 0:
        return crc_a
    return _multiply(_x_to_8n(length_b), crc_a) ^ crc_b


class _Pool:
    """The process's summing threads, one per core (at most 4), started once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._pid = 0
        self.workers = 1

    def executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None or self._pid != os.getpid():   # (a fork has no threads)
                try:
                    cores = len(os.sched_getaffinity(0))
                except (AttributeError, OSError):
                    cores = os.cpu_count() or 1
                self.workers = max(1, min(cores, 4))
                self._executor = ThreadPoolExecutor(self.workers,
                                                    thread_name_prefix=THREAD_PREFIX)
                self._pid = os.getpid()
                # ThreadPoolExecutor starts a thread per submit while none is idle: one
                # waiting task per worker starts them all now, not on the first real sum.
                gate = threading.Barrier(self.workers + 1)
                for _ in range(self.workers):
                    self._executor.submit(gate.wait, 5.0)
                try:
                    gate.wait(5.0)
                except threading.BrokenBarrierError:
                    pass   # slow to start: they still serve, only later
            return self._executor


_POOL = _Pool()


def warm() -> ThreadPoolExecutor:
    """Start the summing threads now (idempotent): call where there is time to spare, before
    the buffers to sum arrive. Returns the pool (one thread per core, at most 4)."""
    return _POOL.executor()


def workers() -> int:
    """The pool's threads (once started: see warm)."""
    return _POOL.workers


class PendingCrc:
    """The CRC-32 of a buffer whose parts are being summed: ``result()`` waits for them and
    joins them (``before``: the CRC of the bytes that precede, pending or known). A part no
    thread has started yet is summed by the caller of result(), whose core would otherwise
    wait (an idle thread takes 0.1-0.3 ms to wake on these VMs: a 4 MiB sum takes 1)."""

    __slots__ = ("_parts", "_views", "_before", "_value")

    def __init__(self, parts: list[Future], views: list[memoryview],
                 before: "PendingCrc | int | None" = None) -> None:
        self._parts, self._views, self._before = parts, views, before
        self._value: int | None = None

    def done(self) -> bool:
        return self._value is not None or (
            all(f.done() for f in self._parts)
            and (not isinstance(self._before, PendingCrc) or self._before.done()))

    def result(self) -> int:
        if self._value is None:
            # Newest first: the parts at the end are the ones the threads have not reached.
            sums = [zlib.crc32(view) if part.cancel() else None
                    for part, view in zip(reversed(self._parts), reversed(self._views))]
            sums.reverse()
            before = self._before
            crc = before.result() if isinstance(before, PendingCrc) else before
            for part, view, got in zip(self._parts, self._views, sums):
                value = part.result() if got is None else got
                crc = value if crc is None else combine(crc, value, len(view))
            self._value = 0 if crc is None else crc
            self._parts, self._views, self._before = [], [], None   # (released)
        return self._value


def checksum(data: Any, before: "PendingCrc | int | None" = None) -> PendingCrc:
    """Sum ``data`` (a buffer: memoryview, bytes, contiguous array) in the pool's threads,
    SPLIT_BYTES at a time; with ``before`` (the CRC of the bytes before it), the result is the
    CRC of both, as ``zlib.crc32(data, before)``. The buffer must stay unchanged until
    ``result()``."""
    view = memoryview(data).cast("B")
    executor = _POOL.executor()
    views = [view[at:at + SPLIT_BYTES] for at in range(0, len(view), SPLIT_BYTES)] or [view]
    return PendingCrc([executor.submit(zlib.crc32, v) for v in views], views, before)


class PendingXxh3:
    """The XXH3-64 of a buffer being hashed in a pool thread: ``result()`` waits for it, or
    hashes the buffer itself if no thread has started on it (the caller's core would
    otherwise wait)."""

    __slots__ = ("_pending", "_value")

    def __init__(self, future: Future, view: memoryview) -> None:
        # The hash in flight and its buffer, until result() has the value (then released).
        self._pending: tuple[Future, memoryview] | None = (future, view)
        self._value = 0

    def done(self) -> bool:
        return self._pending is None or self._pending[0].done()

    def result(self) -> int:
        if self._pending is not None:
            future, view = self._pending
            self._value = (xxhash.xxh3_64_intdigest(view) if future.cancel()
                           else future.result())
            self._pending = None
        return self._value


def xxh3(data: Any) -> PendingXxh3:
    """Hash ``data`` (a buffer) with XXH3-64 in one of the pool's threads. The buffer must stay
    unchanged until ``result()``."""
    view = memoryview(data).cast("B")
    return PendingXxh3(_POOL.executor().submit(xxhash.xxh3_64_intdigest, view), view)


class Xxh3Stream:
    """The XXH3-64 of a piece written in parts, in order: each part is hashed by ``update``
    as it comes, in the caller's thread (a part is at most a piece: a quarter of a
    millisecond), and ``result()`` is the hash of them all, as of the whole piece."""

    __slots__ = ("_state",)

    def __init__(self) -> None:
        self._state = xxhash.xxh3_64()

    def update(self, data: Any) -> "Xxh3Stream":
        self._state.update(memoryview(data).cast("B"))
        return self

    def done(self) -> bool:
        return True

    def result(self) -> int:
        return self._state.intdigest()
