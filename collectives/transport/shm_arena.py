"""Shared-memory arenas for collectives between peers on one host (issue #18): each peer owns
one anonymous memfd that the others map, so an allreduce can reduce straight out of its
peers' memory instead of passing the bytes along a ring (algorithms/shm_allreduce.py).

The arena is made as shm_ring.py makes a ring (memfd, no file name, nothing left behind by a
killed peer) and mapped the same way, through ``/proc/<pid>/fd/<fd>`` of its owner, which the
kernel allows only between processes of the same user; the mapping side checks the memfd's
name on the descriptor it opened, so an announcement cannot make it map another file. What it
trusts: processes of this user on this host that the transport already sends to through
shared memory (the same rule as the rings).

Layout: a header page, whose first 8 bytes are the owner's barrier counter (algorithms/
shm_allreduce.py: it only grows, and only its owner writes it), then the data.

An arena only grows (a larger call makes a new memfd; the peers see the new fd in the next
announcement and map it again), and is unmapped when its communicator's transport closes.
"""
from __future__ import annotations

import mmap
import os

import numpy as np

from collectives.transport.shm_ring import map_memfd

__all__ = ["ShmArena", "ArenaViews", "arena_name", "HEADER_BYTES", "counter_of"]

_PAGE = mmap.PAGESIZE
#: Bytes before the data: the counter, alone on its page (no false sharing with the data).
HEADER_BYTES = 4096


def arena_name(rank: int, kind: str = "arena") -> str:
    """The memfd name of rank ``rank``'s arena of ``kind``, checked before mapping one."""
    return f"gossip-{kind}-r{rank}"


class ShmArena:
    """This peer's arena: ``buffer(nbytes)`` is at least ``nbytes`` of shared memory."""

    def __init__(self, rank: int, kind: str = "arena") -> None:
        self.rank, self.kind = rank, kind
        self.fd = -1
        self.size = 0
        self._mm: mmap.mmap | None = None

    def buffer(self, nbytes: int) -> np.ndarray:
        """The arena's bytes (uint8, the header first), grown to at least ``nbytes`` of data;
        its pages are touched once here, so a first collective does not pay for faults inside
        its timing. Growing keeps the counter's value."""
        if nbytes + HEADER_BYTES > self.size:
            count = int(counter_of(self.buffer(0))[0]) if self.size else 0
            self.close()
            size = -(-(nbytes + HEADER_BYTES) // _PAGE) * _PAGE
            fd = os.memfd_create(arena_name(self.rank, self.kind), 0)
            try:
                os.ftruncate(fd, size)
                self._mm = mmap.mmap(fd, size)
            except BaseException:
                os.close(fd)
                raise
            self.fd, self.size = fd, size
            np.frombuffer(self._mm, dtype=np.uint8)[:] = 0   # commit the pages now
            counter_of(self.buffer(0))[0] = count
        if self._mm is None:   # (mapped above whenever it was smaller)
            raise RuntimeError(f"rank {self.rank}: the {self.kind} is not mapped")
        return np.frombuffer(self._mm, dtype=np.uint8, count=self.size)

    def announcement(self) -> np.ndarray:
        """(pid, fd, size, counter, address) for the others' ArenaViews.view and barriers;
        the address is where this process maps it (algorithms/shm_entry.py probes it)."""
        mine = self.buffer(0)
        return np.array([os.getpid(), self.fd, self.size, counter_of(mine)[0],
                         mine.ctypes.data], dtype=np.int64)

    def close(self) -> None:
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:
                pass   # a view is still alive: the mapping goes with it
            self._mm = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd, self.size = -1, 0


def counter_of(arena: np.ndarray) -> np.ndarray:
    """The barrier counter of an arena's bytes: an int64 pair, [0] the counter, [1] whether a
    peer may sleep on it (transport/futex.py)."""
    return arena[:16].view(np.int64)


class ArenaViews:
    """The other peers' arenas, mapped once per (pid, fd, size) they announce."""

    def __init__(self, kind: str = "arena") -> None:
        self.kind = kind
        self._views: dict[int, tuple[tuple[int, int, int], mmap.mmap]] = {}

    def view(self, rank: int, announced: np.ndarray) -> np.ndarray:
        """Rank ``rank``'s arena bytes (uint8) as it announced them: ValueError if the
        announcement does not point at that rank's arena."""
        pid, fd, size = (int(v) for v in announced[:3])
        key = (pid, fd, size)
        held = self._views.get(rank)
        if held is None or held[0] != key:
            if held is not None:
                self._unmap(rank)
            if pid <= 0 or fd < 0 or not HEADER_BYTES <= size <= 1 << 40:
                raise ValueError(f"rank {rank} announced an arena at pid {pid} fd {fd} of "
                                 f"{size} bytes")
            self._views[rank] = held = (key, map_memfd(pid, fd, size,
                                                       arena_name(rank, self.kind)))
        return np.frombuffer(held[1], dtype=np.uint8, count=size)

    def _unmap(self, rank: int) -> None:
        _, mm = self._views.pop(rank)
        try:
            mm.close()
        except BufferError:
            pass

    def close(self) -> None:
        for rank in list(self._views):
            self._unmap(rank)
