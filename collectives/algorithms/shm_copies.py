"""The collectives that move data without reducing it, and reduce_scatter, among peers on one
host (issue #37): broadcast, allgather, alltoall, gather, scatter and reduce_scatter read
what each peer needs straight out of the others' arrays (transport/cma.py), one copy per
byte, with no ZeroMQ message and no arena between them.

A call is entered through the peers' small arenas as the on-host allreduces are
(shm_entry.py): the slot header carries the address of the array this peer's readers read
(its ``x``; the root's for broadcast and scatter), the entry compares every peer's call
(operation, root, dtype, shape) before anyone reads anything, and says whether every peer can
read every other's memory. Then each peer copies what it needs, shm_direct.READ_BYTES at a
time (faster than one read of a large array), leaves
the call (shm_entry.py's counter: done reading the others), and returns once the peers that
read its arrays left it too: none returns (and lets its caller change or free its array)
while another still reads it, and none waits for peers that read nothing of it (a
broadcast's readers return as soon as they have the root's array; only the root waits).
Where some peer
cannot read the others (ptrace rules, another user), the call runs the operation's ZeroMQ
algorithm instead, the same on every peer: the entry's flag is every peer's.

What a peer reads of another counts as bytes that other sent it (transport.counters), as the
messages would. Only with shared counters (x86-64) and every peer on this host with shared
memory (choice.py's ``on_host_copies``).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from collectives.algorithms.p2p import Call
from collectives.algorithms import shm_direct
from collectives.algorithms.shm_direct import address_of, read_peer, read_range
from collectives.algorithms.shm_entry import (PID, STEPS, WORDS, SharedBarrier, SharedEntry,
                                              count_shared)
from collectives.arrays.adapter import ArrayAdapter
from collectives.transport import cma

__all__ = ["OnHostCopies", "PeerArrays"]


class PeerArrays:
    """The arrays the peers of one call announced (each peer's ``read``, and its ``kept``
    where it announced one): ``copy`` reads a run of one of them into a run of an array
    here; ``reduce`` reduces runs of the others' into one here; ``barrier`` waits until
    every peer reached the same point of the call."""

    def __init__(self, call: Call, adapter: ArrayAdapter, headers: dict[int, np.ndarray],
                 reader: cma.Reader, barrier: Callable[[], None]) -> None:
        self.call, self.adapter, self.reader, self.barrier = call, adapter, reader, barrier
        self.pid = {j: int(h[PID]) for j, h in headers.items()}
        self.address = {j: (int(h[WORDS]), int(h[WORDS + 1])) for j, h in headers.items()}
        self._block = np.empty(0, np.uint8)

    def _where(self, j: int, kept: bool) -> tuple[int, int]:
        return self.pid[j], self.address[j][1 if kept else 0]

    def copy(self, j: int, start: int, into: Any, lo: int, hi: int, kept: bool = False) -> None:
        """Elements [start, start + hi - lo) of rank j's array (its ``kept`` one) into
        ``into[lo:hi]`` (a flat array of the call's adapter)."""
        if hi <= lo:
            return
        size = self.call.itemsize
        nbytes = (hi - lo) * size
        count_shared(self.call.transport, j, nbytes)
        read_range(self.reader, self.call, j, self._where(j, kept), start * size,
                   address_of(self.adapter, into, lo), nbytes)

    def reduce(self, op: str, into: Any, at: int, start: int, stop: int,
               others: list[int]) -> None:
        """``into[at:at + stop - start]`` reduced by ``op`` with elements [start, stop) of
        every peer in ``others``, block by block (each peer's block read into cache and
        reduced there, as the direct allreduce does: shm_direct.BLOCK_BYTES)."""
        size, adapter = self.call.itemsize, self.adapter
        count = stop - start
        block = max(1, shm_direct.BLOCK_BYTES // size)
        if self._block.size < min(block, count) * size:
            self._block = np.empty(min(block, count) * size, np.uint8)
        for j in others:
            count_shared(self.call.transport, j, count * size)
        for a in range(0, count, block):
            b = min(a + block, count)
            mine = adapter.slice(into, at + a, at + b)
            for j in others:
                read_peer(self.reader, self.call, j, self._where(j, False),
                          (start + a) * size, self._block.ctypes.data, (b - a) * size)
                adapter.reduce(op, mine, adapter.from_frame(self._block[:(b - a) * size],
                                                            self.call.frame_dtype, b - a))


class OnHostCopies:
    """A communicator's on-host copies: its entry (shared with the allreduces), their order,
    and a reader."""

    def __init__(self, entry: SharedEntry, order: Any) -> None:
        self.entry = entry
        self.order = order   # choice.py's SequenceOrder: one shared-memory call at a time
        self.reader = cma.Reader()

    def __call__(self, call: Call, adapter: ArrayAdapter, read: Any,
                 move: Callable[[PeerArrays], None], fallback: Callable[[], Any],
                 kept: Any = None, readers: Any = None) -> None:
        """Run ``call``: announce ``read`` (the flat array this peer's readers read, or None)
        and ``kept`` (a second one, read after a barrier of ``move``'s), then ``move`` (the
        copies of this peer) once every peer entered; leave the call, and return once the
        peers that read this peer's arrays (``readers``: every other peer if None; after a
        barrier of ``move``'s, those that read ``kept``) left it too. ``fallback`` (the ZeroMQ
        algorithm) where some peer cannot read the others."""
        t = call.transport
        others = [j for j in range(t.world_size) if j != t.rank]
        with self.order.turn(call):
            try:
                headers = self.entry.enter(call, call.nbytes,
                                           (_address(adapter, read), _address(adapter, kept)))
                if not self.entry.direct:
                    fallback()
                    return
                barrier = SharedBarrier(call, adapter, read, others, self.entry.steps,
                                        {j: int(h[STEPS]) for j, h in headers.items()})
                move(PeerArrays(call, adapter, headers, self.reader, barrier))
                self.entry.leave(call)   # done reading the others' arrays
                self.entry.await_readers(call, others if readers is None else readers)
            finally:
                self.entry.leave(call)


def _address(adapter: ArrayAdapter, flat: Any) -> int:
    return 0 if flat is None else address_of(adapter, flat)
