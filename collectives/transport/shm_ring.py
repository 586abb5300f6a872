"""The memory of a shared-memory ring, one per sending peer and destination on one host: its
layout, how the sender makes it and how the receiver maps it (the protocol that uses it is in
shm.py).

The ring is an anonymous ``memfd`` (no file name, so nothing is left in /dev/shm when a peer is
killed); the receiver maps it through ``/proc/<pid>/fd/<fd>`` of the sender, which the kernel
allows between processes of the same user. Memory is freed when the last process unmaps it.

Layout: ``nslots`` one-byte busy flags, a "sender waiting" flag on its own cache line, then
``nslots`` slots of ``slot_bytes``. The sender sets a busy flag before it writes a slot and the
receiver clears it after it has read it: each flag has one writer per transition, and the data
itself is published by the ZeroMQ message that follows the write (a system call, so a full
memory barrier). Slots are released in any order, so concurrent operations can hold several.
"""
from __future__ import annotations

import mmap
import os
import re
import threading

import numpy as np

__all__ = ["ShmRing", "ShmView", "shm_supported", "parse_open", "ring_name", "map_memfd",
           "MAX_SLOTS", "MAX_SLOT_BYTES"]

#: The most slots a ring has (its busy flags' room below), and the largest slot: a receiver
#: refuses a ring announced beyond either (TransportConfig refuses such settings first).
MAX_SLOTS = 512
MAX_SLOT_BYTES = 1 << 30

_FLAGS_BYTES = 64 * 16  # busy flags of up to 512 slots, then the sender's "waiting" flag
_WAITING = _FLAGS_BYTES - 64  # its own cache line
_OPEN = re.compile(r"memfd:(\d{1,9}):(\d{1,9}):(\d{1,5}):(\d{1,12})")


def shm_supported() -> bool:
    """memfd and /proc: Linux."""
    return hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd")


def ring_name(src: int, dst: int) -> str:
    """The memfd name of the ring rank ``src`` sends to rank ``dst`` through; the receiver
    checks it before mapping what an announcement points to."""
    return f"gossip-r{src}-to-r{dst}"


def parse_open(text: str) -> tuple[int, int, int, int] | None:
    """(pid, fd, nslots, slot_bytes) from a SHM_OPEN announcement, or None if malformed."""
    match = _OPEN.fullmatch(text)
    if not match:
        return None
    pid, fd, nslots, slot_bytes = (int(g) for g in match.groups())
    if not 0 < nslots <= MAX_SLOTS or not 0 < slot_bytes <= MAX_SLOT_BYTES:
        return None
    return pid, fd, nslots, slot_bytes


class ShmRing:
    """The sender's side: owns the memfd and hands out free slots."""

    def __init__(self, nslots: int, slot_bytes: int, name: str = "gossip-ring") -> None:
        self.nslots = nslots
        self.slot_bytes = slot_bytes
        self.fd = os.memfd_create(name, 0)  # inheritable off by default in Python
        size = _FLAGS_BYTES + nslots * slot_bytes
        os.ftruncate(self.fd, size)
        self._mm = mmap.mmap(self.fd, size)
        # Views of the mapping: the slots' flags, the waiting flag, the slots; None once
        # closed.
        self.flags: np.ndarray | None = np.frombuffer(self._mm, dtype=np.uint8, count=nslots)
        self.waiting: np.ndarray | None = np.frombuffer(self._mm, dtype=np.uint8, count=1,
                                                        offset=_WAITING)
        self.data: np.ndarray | None = np.frombuffer(self._mm, dtype=np.uint8,
                                                     offset=_FLAGS_BYTES)
        self.lock = threading.Lock()

    def first_slot(self) -> np.ndarray:
        """The first slot's bytes, the ones every message uses first (lowest slot first):
        writing zeros there before the ring is in use commits its pages (numpy fills without
        the GIL); a fresh memfd page costs a fault and its zeroing on first touch, 4 MiB
        about 2-6 ms on this project's 2-core machine against 0.1 ms once warm. The view
        keeps the mapping alive after close()."""
        return self._views()[2][:self.slot_bytes]

    def announcement(self) -> str:
        """The SHM_OPEN text that tells the receiver where to map this ring (read by parse_open)."""
        return f"memfd:{os.getpid()}:{self.fd}:{self.nslots}:{self.slot_bytes}"

    def try_acquire(self) -> int | None:
        """The lowest free slot, now marked busy, or None. Call with ``lock`` held.

        Lowest first, not round robin: a peer that sends one message at a time reuses the
        same slot or two, which stay in the caches of both ends (a rotation through every
        slot would stream the whole ring, nslots * slot_bytes, through memory)."""
        flags = self.flags
        if flags is None:
            raise RuntimeError("the shared-memory ring is closed")
        for slot in range(self.nslots):
            if flags[slot] == 0:
                flags[slot] = 1
                return slot
        return None

    def write(self, slot: int, payload) -> int:
        """Copy ``payload`` (a bytes-like object) into ``slot``; returns its length."""
        src = np.frombuffer(payload, dtype=np.uint8)
        start = slot * self.slot_bytes
        data = self.data
        if data is None:
            raise RuntimeError("the shared-memory ring is closed")
        data[start:start + src.size] = src
        return src.size

    def want_credit(self) -> None:
        """Raise the waiting flag (call with ``lock`` held): the receiver answers the next
        slot it frees with a CREDIT."""
        self._views()[1][0] = 1

    def _views(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(flags, waiting, data); RuntimeError once closed."""
        flags, waiting, data = self.flags, self.waiting, self.data
        if flags is None or waiting is None or data is None:
            raise RuntimeError("the shared-memory ring is closed")
        return flags, waiting, data

    def close(self) -> None:
        """Unmap the ring here and close its memfd (the receiver's mapping keeps the memory); a view
        still alive here keeps this mapping until it goes."""
        self.flags = self.data = self.waiting = None
        try:
            self._mm.close()
        except BufferError:
            pass  # a view is still alive somewhere; the mapping goes with it
        try:
            os.close(self.fd)
        except OSError:
            pass


def map_memfd(pid: int, fd: int, size: int, name: str | None) -> mmap.mmap:
    """Map ``size`` bytes of another process's memfd, through /proc (same user only).

    An announcement names any fd of any process of this user: without the name check a
    forged one would make us map (and write into) an arbitrary open file. It is checked on
    the descriptor we hold, so the fd cannot be swapped after the check. ValueError if it is
    not the memfd ``name``, OSError if it is smaller than ``size``."""
    handle = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR)
    try:
        if name is not None:
            target = os.readlink(f"/proc/self/fd/{handle}")
            if target != f"/memfd:{name} (deleted)":
                raise ValueError(f"pid {pid} fd {fd} is {target[:80]!r}, not the shared "
                                 f"memory {name!r}")
        if os.fstat(handle).st_size < size:
            raise OSError(f"the shared memory {name!r} of pid {pid} is smaller than announced")
        return mmap.mmap(handle, size)
    finally:
        os.close(handle)


class ShmView:
    """The receiver's side: a mapping of another peer's ring."""

    def __init__(self, pid: int, fd: int, nslots: int, slot_bytes: int, *,
                 name: str | None = None) -> None:
        self.nslots = nslots
        self.slot_bytes = slot_bytes
        size = _FLAGS_BYTES + nslots * slot_bytes
        self._mm = map_memfd(pid, fd, size, name)
        # The ring's flags; None once closed (release() is then a no-op).
        self.flags: np.ndarray | None = np.frombuffer(self._mm, dtype=np.uint8, count=nslots)
        self.waiting: np.ndarray | None = np.frombuffer(self._mm, dtype=np.uint8, count=1,
                                                        offset=_WAITING)
        self._data = memoryview(self._mm)[_FLAGS_BYTES:]

    def chunk(self, slot: int, length: int) -> memoryview:
        """The first ``length`` bytes of ``slot``, without a copy: valid until the slot is
        released."""
        start = slot * self.slot_bytes
        return self._data[start:start + length]

    def release(self, slot: int) -> bool:
        """Free a slot; True if the sender was waiting for one (it wants a CREDIT message)."""
        flags, waiting = self.flags, self.waiting
        if flags is None or waiting is None:   # (closed: both are)
            return False
        flags[slot] = 0
        if waiting[0]:
            waiting[0] = 0
            return True
        return False

    def close(self) -> None:
        """Unmap the sender's ring; a chunk still alive keeps the mapping until it goes."""
        self.flags = self.waiting = None
        try:
            self._data.release()
            self._mm.close()
        except BufferError:
            pass
