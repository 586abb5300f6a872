"""The on-host allreduce reading the peers' own arrays (issue #18): once every peer can read
every other's memory (shm_entry.py probes it; transport/cma.py reads), no arena is copied
into. Peer r reduces its slice r block by block, each peer's block read straight from that
peer's array into a cache-sized buffer and added to its own; a barrier; then it reads every
other peer's reduced slice straight into its array; a last barrier, so no one returns (and
lets its caller change its array) while another still reads it. Per peer and byte, (n-1)/n
is read from the peers for the reduce and (n-1)/n for the result: the memory traffic of the
bound, with nothing allocated but the block buffer.

The peers read only what the call's slot headers announced, after the entry compared their
calls. Every element is reduced by one peer and read by the others: bitwise identical. What
a peer reads of another counts as bytes that other sent it (transport.counters).

A call that fails (a peer lost, its abort) leaves each element of a peer's array either as
it was or at its result, as hivemind's averager promises: a block of the peer's own slice
is reduced in a buffer and written only once every peer's block is in it, and what is read
of the others' slices after the first barrier is their result.
"""
from __future__ import annotations

import errno
from typing import Any, Callable

import numpy as np

from collectives.algorithms.p2p import Call
from collectives.algorithms.ring import segments
from collectives.algorithms.shm_entry import (PID, STEPS, WORDS, SharedBarrier, SharedEntry,
                                              await_abort, count_shared)
from collectives.arrays.adapter import ArrayAdapter
from collectives.errors import PeerLost, ProtocolError
from collectives.transport import cma

__all__ = ["DirectReads", "reduce_aside", "read_peer", "read_range", "write_peer",
           "write_range", "address_of", "BLOCK_BYTES",
           "DIRECT_MIN_BYTES", "READ_BYTES"]

#: Bytes read from a peer and reduced at a time (stays in cache).
BLOCK_BYTES = 1 << 20
#: The smallest array read this way. Below it the arenas are faster, their copies served from
#: cache, where each read of a peer pins its pages anew (measured, 2 peers on 2 cores: 4 MiB
#: 427 us with arenas against 560 us, 8 MiB even, 16 MiB 2.2 against 1.7 ms, 64 MiB 8.9
#: against 5.3 ms); from it on no arena is kept beyond what smaller calls need.
DIRECT_MIN_BYTES = 8 << 20
#: Bytes per process_vm_readv of a long run straight into its destination (64 MiB in reads of
#: 4 MiB: 6.6 ms against 10.2 ms in one read, 2 processes on this 2-core machine).
READ_BYTES = 4 << 20


class DirectReads:
    """A communicator's direct-read allreduce: its block buffer and its reader."""

    def __init__(self, entry: SharedEntry) -> None:
        self.entry = entry
        self.reader = cma.Reader()
        self._block = np.empty(0, np.uint8)

    def __call__(self, call: Call, adapter: ArrayAdapter, flat: Any, op: str,
                 others: list[int], headers: dict[int, np.ndarray]) -> None:
        """Reduce ``flat`` by ``op`` with the peers' arrays at the addresses in their
        ``headers`` (the words after WORDS: data arena, then address)."""
        t = call.transport
        n, r = t.world_size, t.rank
        reduce_op = "sum" if op == "mean" else op
        count, size = adapter.size(flat), call.itemsize
        segs = segments(count, n)
        where = {j: (int(headers[j][PID]), int(headers[j][WORDS + 4])) for j in others}
        barrier = SharedBarrier(call, adapter, flat, others, self.entry.steps,
                                {j: int(h[STEPS]) for j, h in headers.items()})
        for j in others:   # what j reads of this peer's array
            count_shared(t, j, (segs[j][1] - segs[j][0] + segs[r][1] - segs[r][0]) * size)
        if self._block.size < 2 * BLOCK_BYTES:
            self._block = np.empty(2 * BLOCK_BYTES, np.uint8)
        lo, hi = segs[r]
        reduce_aside(self.reader, call, adapter, reduce_op, flat, at=lo, start=lo, stop=hi,
                     where=where, scratch=self._block, divide_by=n if op == "mean" else 0)
        barrier()   # every slice is reduced
        for j in others:
            a, b = segs[j]
            if b > a:
                into = np.frombuffer(adapter.send_buffer(flat, a, b), np.uint8).ctypes.data
                read_peer(self.reader, call, j, where[j], a * size, into, (b - a) * size)
        barrier()   # no one reads this peer's array any more


def reduce_aside(reader: cma.Reader, call: Call, adapter: ArrayAdapter, op: str, into: Any, *,
                 at: int, start: int, stop: int, where: dict[int, tuple[int, int]],
                 scratch: np.ndarray, divide_by: int = 0) -> None:
    """``into[at:at + stop - start]`` reduced by ``op`` with elements [start, stop) of the
    array of every peer j in ``where`` (its pid and the array's address; in that order), then
    divided by ``divide_by`` if given (op "mean"), one block of BLOCK_BYTES at a time: each
    peer's block is read into the first half of ``scratch`` (at least 2 * BLOCK_BYTES bytes,
    or twice the run); the sums before the last peer's are made in its second half, and the
    last one is written into this peer's block (``reduce_into``: no pass more than reducing
    in place, and the same bytes). A peer lost half-way thus leaves each element of ``into``
    either as it was or at its result, never a partial sum (hivemind's averager promises as
    much)."""
    size = call.itemsize
    block = max(1, BLOCK_BYTES // size)
    half = min(block, max(0, stop - start)) * size
    buffer = scratch.ctypes.data
    last = len(where) - 1
    for a in range(start, stop, block):
        b = min(a + block, stop)
        m, nbytes = b - a, (b - a) * size
        mine = adapter.slice(into, at + a - start, at + b - start)
        acc = adapter.from_frame(scratch[half:half + nbytes], call.frame_dtype, m)
        got = adapter.from_frame(scratch[:nbytes], call.frame_dtype, m)
        for k, (j, peer) in enumerate(where.items()):
            read_peer(reader, call, j, peer, a * size, buffer, nbytes)
            if k == last:   # (every read done: this peer's block gets the result)
                adapter.reduce_into(op, mine, mine if k == 0 else acc, got)
            elif k == 0:
                adapter.reduce_into(op, acc, mine, got)
            else:
                adapter.reduce(op, acc, got)
        if divide_by:
            adapter.divide(mine, divide_by)


def read_peer(reader: cma.Reader, call: Call, j: int, where: tuple[int, int], offset: int,
              into: int, nbytes: int) -> None:
    """``nbytes`` at ``offset`` of rank j's array, at ``where`` (its pid, the array's
    address), to address ``into`` here; its abort if it gave up on the call (whether or not
    its process still runs), else PeerLost if j is gone, else ProtocolError."""
    _peer_memory(reader.read, call, j, where, offset, into, nbytes, done="read")


def write_peer(reader: cma.Reader, call: Call, j: int, where: tuple[int, int], offset: int,
               local: int, nbytes: int) -> None:
    """read_peer's other way: ``nbytes`` at address ``local`` here into rank j's array at
    ``where``, from ``offset`` on (process_vm_writev); the same errors."""
    _peer_memory(reader.write, call, j, where, offset, local, nbytes, done="written")


def _peer_memory(move: Callable[[int, int, int, int], None], call: Call, j: int,
                 where: tuple[int, int], offset: int, local: int, nbytes: int, *,
                 done: str) -> None:
    pid, address = where
    try:
        move(pid, address + offset, local, nbytes)
    except OSError as exc:
        r, what = call.transport.rank, call.describe()
        if exc.errno == errno.ESRCH:
            # It may have ended after failing the call for another peer's loss: its abort,
            # sent before it returned, names that one.
            await_abort(call, j, grace=0.2)
            raise PeerLost(f"rank {r}: {what}: rank {j} (process {pid}) ended while its "
                           f"array was being {done}", rank=j, operation=what) from None
        # Its array is gone while it is alive: it gave up on the call (a lost peer, a
        # timeout) and returned; raise what it says (its abort), not the symptom.
        await_abort(call, j, grace=1.0)
        verb = "read" if done == "read" else "write into"
        raise ProtocolError(f"rank {r}: {what}: cannot {verb} rank {j}'s array (process "
                            f"{pid}): {exc}") from None


def read_range(reader: cma.Reader, call: Call, j: int, where: tuple[int, int], offset: int,
               into: int, nbytes: int) -> None:
    """read_peer of a long run, READ_BYTES at a time."""
    for at in range(0, nbytes, READ_BYTES):
        read_peer(reader, call, j, where, offset + at, into + at, min(READ_BYTES, nbytes - at))


def write_range(reader: cma.Reader, call: Call, j: int, where: tuple[int, int], offset: int,
                local: int, nbytes: int) -> None:
    """write_peer of a long run, READ_BYTES at a time."""
    for at in range(0, nbytes, READ_BYTES):
        write_peer(reader, call, j, where, offset + at, local + at,
                   min(READ_BYTES, nbytes - at))


def address_of(adapter: ArrayAdapter, flat: Any, start: int = 0) -> int:
    """The address of element ``start`` of a flat host array (0 for an empty one), as the
    peers that read it are told."""
    if adapter.size(flat) <= start:
        return 0
    return np.frombuffer(adapter.send_buffer(flat, start, start + 1), np.uint8).ctypes.data
