"""The neighbour exchange on one host without copying the array (issues #18, #37): instead of
its array, a peer sends each destination a three-word note (its pid, the array's address, the
destination's weight), and each destination reads the array straight out of the sender's
memory (transport/cma.py). A reader then tells the sender it is done (an empty chunk of the
call), and the sender answers each reader (another empty chunk) once every reader of its
array is done, which tells the reader that what it read was that array, still in the call: a
sender that failed and returned (its array freed, its memory perhaps reused) never answers,
so its readers raise its abort. Only the peers of the exchange wait for each other, as in the
copying exchange.

The round is one pass over memory, in cache-sized blocks: for each block, every source's
block is read into cache and summed there, this peer's own block added, and the weighted sum
written once, straight into the array (``x <- w x + sum_j w_j x_j`` needs no second buffer).
A block may be overwritten only once every reader of this peer's array has read it, so each
reader marks, in its shared-memory arena's header page (shm_entry.py's read marks), the call
and how far it has read each source; a peer about to write a block reads its readers' marks,
waits for them (yielding the CPU a moment, then asleep on the reader's mark, a futex the
reader wakes as it moves; at most WAIT_SECONDS: the round cannot end before its readers are
done anyway, and a reader behind is usually one the scheduler has not run), and otherwise
writes the block to the scratch buffer and copies it over once the round ends (and, that
round, waits no more: a reader that late waits itself, for a peer late to the round, or
failed). Peers a block apart thus move through their arrays together, and
none waits on another that is not behind it, so no wait goes round a cycle. A block counts
as read only by a mark of this very call; one exchange at a time marks (another running at
the same time, a Work beside a blocking call, marks nothing, so its sources write aside). If the round
fails, the array may hold the result in part (with ``out``, it is never written).

The note is the call's first data chunk to each destination, so the pairing check
(pattern.py) rides on it unchanged. Peers choose this way alike (the exchange decides from
what every peer saw: operations/neighbor_allreduce.py) and the signature says so, so a peer
that copies meets a ProtocolError, never a misread note. Not for ``partial`` rounds (a lost
peer's memory cannot be read; push-sum's rule needs the copying exchange's accounting).
"""
from __future__ import annotations

import os
import time
from typing import Any, NamedTuple

import numpy as np

from collectives.algorithms.neighbor import combine, refuse
from collectives.algorithms.p2p import Call, post_range, recv_range, wait_sent
from collectives.algorithms.pattern import announce, check_pairing, plan_bits
from collectives.algorithms.shm_direct import address_of, read_peer
from collectives.algorithms.shm_entry import (READ_MARK_SOURCES, SHARED_COUNTERS, SharedEntry,
                                              count_shared, spin_seconds)
from collectives.arrays.adapter import ArrayAdapter, adapter_for
from collectives.neighbor_plan import NeighborPlan
from collectives.transport import cma, futex

__all__ = ["direct_exchange", "empty_chunk", "DIRECT_NEIGHBOR_MIN_BYTES", "DIRECT_SIGNATURE",
           "BLOCK_BYTES", "WAIT_SECONDS"]

#: The smallest array exchanged this way: below, the copies through the rings cost as much as
#: pinning the sender's pages for every read (ring of 4 on 2 cores, `gossip bench neighbor`:
#: 4 MiB 7.4-9.8 ms read against 5.9-7.6 ms copied, 8 MiB 10.1 against 14.0, 16 MiB 18.1
#: against 24.8, 64 MiB 72.9 against 87.9).
DIRECT_NEIGHBOR_MIN_BYTES = 8 << 20
#: What the signature carries when the exchange goes this way.
DIRECT_SIGNATURE = "+direct"

#: How long a peer waits for its readers to be done with a block before it writes the block
#: to the scratch buffer instead (and copies it over once the round ends); once a wait ran
#: out, the round's later blocks do not wait. A wait sleeps (it costs no CPU), and the round
#: cannot end before its readers are done anyway.
WAIT_SECONDS = 0.1

#: Bytes of each array a round combines at a time: the sum, a source's block and this peer's
#: own stay in a core's L2 (2 MiB here). Ring of 4 on 2 cores, 64 MiB, CPU time a round:
#: 128 KiB 40.9 ms, 256 KiB 35.5, 512 KiB 34.7, 1 MiB 41.1 (2026-12-05).
BLOCK_BYTES = 512 << 10

_NOTE_BYTES = 24   # pid, address (int64), weight (float64)


def direct_exchange(call: Call, adapter: ArrayAdapter, flat: Any, plan: NeighborPlan, *,
                    scratch: Any, reader: cma.Reader, entry: SharedEntry | None = None,
                    out: Any = None) -> dict[int, Exception]:
    """neighbor_exchange's result (algorithms/neighbor.py), reading the sources' arrays.
    ``entry``: the communicator's shared-memory entry, whose read marks let a block be
    written in place (module docstring); None writes every block to ``scratch`` first."""
    src_weights, dst_ranks, dst_weights = plan.src_weights, plan.dst_ranks, plan.dst_weights
    checked = plan.check_pattern
    t = call.transport
    size, itemsize = adapter.size(flat), call.itemsize
    peers = plan.peers
    if checked:
        announce(call, peers, src_weights, dst_ranks)
    address = address_of(adapter, flat)
    k = -(-_NOTE_BYTES // itemsize)   # the note, as elements of the call's dtype
    notes, tickets = [], []
    for dst in dst_ranks:
        note = np.zeros(k * itemsize, np.uint8)
        note[:16].view(np.int64)[:] = (os.getpid(), address)
        note[16:24].view(np.float64)[0] = 1.0 if dst_weights is None else dst_weights[dst]
        note = note.view(np.dtype(call.dtype))
        notes.append(note)
        tickets.append(post_range(call, dst, adapter_for(note), note, 0, k, track=True,
                                  plan=plan_bits(dst, src_weights, dst_ranks) if checked else 0))
        count_shared(t, dst, size * itemsize)   # what it reads here
    problems = check_pairing(call, peers, src_weights, dst_ranks) if checked else None
    if problems:
        refuse(call, peers, problems, tickets)
    sources = []
    for src in sorted(src_weights):
        got = np.empty(k, np.dtype(call.dtype))
        for lo, hi, chunk in recv_range(call, src, adapter_for(got), 0, k):
            got[lo:hi] = chunk
        raw = got.view(np.uint8)
        pid, where = (int(v) for v in raw[:16].view(np.int64))
        sources.append(_Source(src, (pid, where),
                               src_weights[src] * float(raw[16:24].view(np.float64)[0])))
    deferred: list[tuple[int, int]] = []
    if sources:
        marks = _Marks(entry, call, [s.rank for s in sources],
                       dst_ranks if out is None else None)
        try:
            deferred = _combine(call, adapter, flat, plan.self_weight, sources, reader, marks,
                                dest=flat if out is None else out, scratch=scratch)
        finally:
            marks.close()
    for source in sources:   # done reading it
        tickets.append(post_range(call, source.rank, adapter, flat, 0, 0))
    for dst in dst_ranks:   # every reader of this peer's array is done with it, and is told
        empty_chunk(call, dst, adapter)   # its reads were of this array, still in the call
        tickets.append(post_range(call, dst, adapter, flat, 0, 0))
    for source in sources:   # ... and so was every array read here
        empty_chunk(call, source.rank, adapter)
    for ticket in tickets:
        if ticket is not None:
            wait_sent(call, ticket)
    if not sources:
        combine(adapter, flat, plan.self_weight, scratch, out, heard=False)
    for a, b in deferred:   # the blocks a reader had not finished when they were combined
        adapter.copy(adapter.slice(flat, a, b), adapter.slice(scratch, a, b))
    return {}


class _Source(NamedTuple):
    rank: int
    where: tuple[int, int]   # its pid, its array's address
    weight: float            # the plan's weight times its note's (push-sum's share)


class _Marks:
    """A call's read marks (module docstring): this peer marks how far it read each source
    (a rank below READ_MARK_SOURCES) in its arena; ``readers``: the destinations whose
    marks say when a block of this peer's array may be overwritten (None: nothing is written
    in place). Without an entry or shared counters nothing is marked and nothing written in
    place."""

    def __init__(self, entry: SharedEntry | None, call: Call, sources: list[int],
                 readers: Any) -> None:
        me, seq = call.transport.rank, call.seq
        usable = entry is not None and SHARED_COUNTERS
        self.seq = seq
        self.spin = spin_seconds(call.transport.world_size)
        # One exchange at a time marks (another running at once, a Work beside a blocking
        # call, leaves its sources to wait for "done"): two would interleave their words.
        self.lock = entry.marks_lock if usable and entry is not None else None
        if self.lock is not None and not self.lock.acquire(blocking=False):
            self.lock = None
        self.mine = entry.read_marks(me) if self.lock is not None and entry is not None \
            else None
        self.sources = [s for s in sources if s < READ_MARK_SOURCES]
        if self.mine is not None:
            for s in self.sources:   # nothing read yet, then the call: stores stay in order
                self.mine[4 * s + 1] = 0
                self.mine[4 * s] = seq
        self.readers = None
        self.patient = True   # (until one wait runs out)
        if usable and entry is not None and readers is not None and me < READ_MARK_SOURCES:
            self.readers = [entry.read_marks(d)[4 * me:4 * me + 3] for d in readers]

    def close(self) -> None:
        """The call is done marking."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def read(self, source: int, through: int) -> None:
        """This peer read ``source``'s elements before ``through`` (waking it if it sleeps
        on that)."""
        if self.mine is not None and source < READ_MARK_SOURCES:
            futex.publish(self.mine[4 * source + 1:4 * source + 3], through)

    def free(self, through: int) -> bool:
        """Every reader is done with this peer's elements before ``through`` (it marked them
        read in this call), or will be within WAIT_SECONDS (yielding the CPU
        a moment, then asleep until the reader's mark moves); after one wait ran out, the
        call waits no more."""
        if self.readers is None:
            return False
        late = self._late(through)
        if late is None:
            return True
        if not self.patient:
            return False
        now = time.monotonic()
        spin_until, deadline = now + self.spin, now + WAIT_SECONDS
        while late is not None:
            now = time.monotonic()
            if now > deadline:
                # A reader this late waits itself (for a peer late to the round, or it
                # failed): the rest of the round writes aside rather than wait for it.
                self.patient = False
                return False
            if now < spin_until:
                os.sched_yield()
            else:   # (a wake-up can be missed: woken or not, a millisecond at most)
                futex.wait(late[1:3], through, 0.001)
            late = self._late(through)
        return True

    def _late(self, through: int) -> np.ndarray | None:
        """The first reader not done with the elements before ``through``, or None."""
        seq = self.seq
        for words in self.readers or ():
            # The call, then the count (loads stay in order, as the reader's stores: a count
            # read after this call's number is this call's or later in it).
            if int(words[0]) != seq or int(words[1]) < through:
                return words
        return None


def _combine(call: Call, adapter: ArrayAdapter, flat: Any, self_weight: float,
             sources: list[_Source], reader: cma.Reader, marks: _Marks, *, dest: Any,
             scratch: Any) -> list[tuple[int, int]]:
    """``dest`` <- self_weight * flat + the sources' weighted arrays, block by block: each
    source's block read into cache, summed there and written once; scaled by the first
    source's weight after the sum (one multiply a block instead of one a source, and
    none at all where the weights are equal, as on a ring). Where ``dest`` is ``flat``, a
    block whose readers are not done with it goes to ``scratch``; returns those blocks."""
    size, itemsize, dtype = adapter.size(flat), call.itemsize, call.frame_dtype
    block = max(1, BLOCK_BYTES // itemsize)
    summed = np.empty(min(block, size) * itemsize, np.uint8)
    buffer = np.empty(summed.size if len(sources) > 1 else 0, np.uint8)
    first = sources[0]
    pivot = first.weight if first.weight != 0 else 1.0
    in_place = dest is flat
    deferred = []
    for a in range(0, size, block):
        b = min(a + block, size)
        nbytes = (b - a) * itemsize
        read_peer(reader, call, first.rank, first.where, a * itemsize, summed.ctypes.data,
                  nbytes)
        marks.read(first.rank, b)
        acc = adapter.from_frame(summed[:nbytes], dtype, b - a)
        if first.weight == 0:
            adapter.scale(acc, 0.0)
        for source in sources[1:]:
            read_peer(reader, call, source.rank, source.where, a * itemsize,
                      buffer.ctypes.data, nbytes)
            marks.read(source.rank, b)
            adapter.axpy(acc, source.weight / pivot,
                         adapter.from_frame(buffer[:nbytes], dtype, b - a))
        if self_weight != 0:
            adapter.axpy(acc, self_weight / pivot, adapter.slice(flat, a, b))
        into = dest
        if in_place and not marks.free(b):
            into = scratch
            deferred.append((a, b))
        adapter.scaled_copy(adapter.slice(into, a, b), pivot, acc)
    return deferred


def empty_chunk(call: Call, peer: int, adapter: ArrayAdapter) -> None:
    """Receive the empty chunk of ``call`` that ``peer`` sends (a "done" or its answer)."""
    for _ in recv_range(call, peer, adapter, 0, 0):
        pass
