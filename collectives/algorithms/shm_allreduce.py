"""Allreduce among peers on one host through shared memory (issue #18): each peer copies its
array into its own arena (transport/shm_arena.py), the peers reduce slice r straight out of
every arena into its own array (its own slice never leaves it), publishes it in its arena,
and each copies the others' reduced slices out. Per peer and byte: (n-1)/n copied in, n reads
of 1/n (the reduce) and 1/n published while in cache, (n-1)/n copied out; no chunk hand-offs
through ZeroMQ messages and the I/O thread, as the ring's 2(n-1) steps make. From
DIRECT_MIN_BYTES, where every peer can read every other's memory, the peers read each other's
arrays instead and hold no arena (shm_direct.py).

Rounds of at most ROUND_BYTES per peer keep the arena small (peak memory: the array plus two
rounds), alternating between the arena's two halves: a peer writes half h in round k only
after every peer's round k-1 began, which each began after reading half h in round k-2.

A call is entered and left through the peers' small arenas (shm_entry.py): no ZeroMQ after
the first call. The slot header carries this peer's data arena (pid, fd, size, counter), so a
peer whose arena grew is mapped again there, and a peer making another call, or of another
size or dtype, is a ProtocolError on every peer before anyone reads another's memory; the
entry also says each finished the call before. Then two barriers a round: "my round is in",
"my slice is reduced". A barrier is the counter in each data arena's header: a peer bumps its
own after its writes and waits until every other's reached the same step of this call
(counted from the values in the headers, so a call that failed half-way on some peers leaves
nothing out of step). Where stores are not seen in program order (not x86-64), the arenas are
announced as the call's first elements over ZeroMQ and the barriers are empty chunks of the
call. Every element is reduced by one peer and copied to the others: the peers end bitwise
identical. What a peer reads of another's arena counts as bytes that other sent it
(transport.counters), as the ring's chunks would.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from collectives.algorithms.p2p import Call, wait_sent
from collectives.algorithms.ring import ring_allreduce, segments
from collectives.algorithms.shm_direct import DIRECT_MIN_BYTES, DirectReads
from collectives.algorithms.shm_entry import (ANNOUNCEMENT_BYTES, SHARED_COUNTERS, WORDS,
                                              SharedBarrier, SharedEntry, count_shared,
                                              exchange_arenas, map_arena)
from collectives.arrays.adapter import ArrayAdapter
from collectives.transport.shm_arena import HEADER_BYTES, ArenaViews, ShmArena, counter_of

__all__ = ["OnHostAllreduce", "on_host", "shared_memory_peers", "ROUND_BYTES", "SHM_MIN_BYTES"]

#: Bytes of each peer's array per round (the arena holds two): peak memory 1.25x a 64 MiB
#: array where the peers cannot read each other's arrays (shm_direct.py).
ROUND_BYTES = 8 << 20
#: Reduce in blocks of this many bytes, every peer's block in turn (stays in cache).
BLOCK_BYTES = 256 << 10
#: The smallest array "auto" sends this way where the barriers are ZeroMQ messages (not
#: x86-64): below it they dominate. On x86-64 "auto" takes it above shm-small's 64 KiB.
SHM_MIN_BYTES = 1 << 20


def shared_memory_peers(transport: Any) -> frozenset[int]:
    """The ranks whose memory the on-host algorithms may use directly, with no message (an
    allreduce, a barrier or a neighbour exchange through shared memory): the transport's
    on-host peers, or none under link emulation (``config.link``), where every byte between
    two peers crosses an emulated link; a read of a peer's memory would cost nothing the
    network would, and the run would not show what it claims."""
    return frozenset() if transport.config.link is not None else transport.on_host_peers()


def on_host(transport: Any, adapter: ArrayAdapter, dtype: str, nbytes: int,
            peers=None) -> bool:
    """The shared-memory paths can run: the ``peers`` (default: every other peer) are on
    this host with shared memory and no link emulation (shared_memory_peers), the array is
    in host memory, of a dtype numpy reads (not bfloat16), and holds an announcement. The
    same answer on every peer of one call."""
    if not (adapter.on_host and nbytes >= ANNOUNCEMENT_BYTES and _numpy_reads(dtype)):
        return False
    here = shared_memory_peers(transport)
    if peers is None:   # every other peer
        n, r = transport.world_size, transport.rank
        return n > 1 and all(j in here for j in range(n) if j != r)
    others = set(peers)
    return bool(others) and others <= here


_NUMPY_READS: dict[str, bool] = {}


def _numpy_reads(dtype: str) -> bool:
    """numpy has the wire dtype ``dtype`` (not bfloat16); remembered, since every small call
    on one host asks."""
    reads = _NUMPY_READS.get(dtype)
    if reads is None:
        try:
            np.dtype(dtype)
            reads = True
        except TypeError:
            reads = False
        if len(_NUMPY_READS) < 256:
            _NUMPY_READS[dtype] = reads
    return reads


class OnHostAllreduce:
    """A communicator's on-host allreduce: its arena and its mappings of the peers'."""

    def __init__(self, rank: int, entry: SharedEntry, order: Any) -> None:
        self.arena = ShmArena(rank)
        self.views = ArenaViews()
        self.entry = entry   # entered and left without ZeroMQ (x86-64)
        self.order = order   # choice.py's SequenceOrder: one call at a time, in order
        self.direct = DirectReads(entry)

    def __call__(self, call: Call, adapter: ArrayAdapter, flat: Any, op: str) -> None:
        with self.order.turn(call):
            try:
                self._run(call, adapter, flat, op)
            finally:
                if SHARED_COUNTERS:
                    self.entry.leave(call)

    def _enter(self, call: Call, adapter: ArrayAdapter, flat: Any, op: str, others: list[int],
               nbytes: int) -> tuple[dict[int, np.ndarray], dict[int, int]] | None:
        """Every peer's data arena (of at least ``nbytes``) and its counter at the start; None
        when the peers read each other's arrays directly instead (then done here)."""
        if not SHARED_COUNTERS:
            arenas, announced = exchange_arenas(call, others, self.arena, self.views, nbytes)
            return arenas, {j: int(a[3]) for j, a in announced.items()}
        # Once every peer could read every other, they always can (shm_entry.py), so a peer
        # that expects direct reads needs no arena; before the first entry it can only go by
        # its own probe.
        self.entry.ready(call)
        direct = call.nbytes >= DIRECT_MIN_BYTES
        expect = self.entry.can_read if self.entry.direct is None else self.entry.direct
        mine = None if direct and expect else self.arena.buffer(nbytes)
        announcement = self.arena.announcement()[:4] if mine is not None else (0, -1, 0, 0)
        address = np.frombuffer(adapter.send_buffer(flat, 0, 1), np.uint8).ctypes.data
        headers = self.entry.enter(call, call.nbytes, (*announcement, address))
        if direct and self.entry.direct:
            self.views.close()   # an arena larger than smaller calls need goes back
            if self.arena.size > 2 * DIRECT_MIN_BYTES + HEADER_BYTES:
                self.arena.close()
            self.direct(call, adapter, flat, op, others, headers)
            return None
        # (Without an arena of its own this peer announced -1: it is among those.)
        if mine is None or any(h[WORDS + 1] < 0 for h in headers.values()):
            # Some peer expected direct reads and has no arena, some peer cannot read: this
            # once (the flags are known from here on), the ring over ZeroMQ.
            ring_allreduce(call, adapter, flat, op)
            return None
        arenas = {j: map_arena(call, self.views, j, headers[j][WORDS:], nbytes) for j in others}
        arenas[call.transport.rank] = mine
        return arenas, {j: int(h[WORDS + 3]) for j, h in headers.items()}

    def _run(self, call: Call, adapter: ArrayAdapter, flat: Any, op: str) -> None:
        t = call.transport
        n, r = t.world_size, t.rank
        others = [j for j in range(n) if j != r]
        count, size = adapter.size(flat), call.itemsize
        per_round = max(1, min(count, ROUND_BYTES // size))
        half = per_round * size
        reduce_op = "sum" if op == "mean" else op
        entered = self._enter(call, adapter, flat, op, others, 2 * half)
        if entered is None:
            return
        arenas, bases = entered
        barrier = SharedBarrier(call, adapter, flat, others,
                                {j: counter_of(a) for j, a in arenas.items()}, bases)
        for k, start in enumerate(range(0, count, per_round)):
            stop = min(start + per_round, count)
            m, offset = stop - start, (k % 2) * half

            def part(j: int, lo: int, hi: int) -> Any:
                frame = arenas[j][HEADER_BYTES + offset + lo * size:
                                  HEADER_BYTES + offset + hi * size]
                return adapter.from_frame(frame, call.frame_dtype, hi - lo)

            segs = segments(m, n)
            for j in others:   # what the others reduce (this peer's slice stays put)
                a, b = segs[j]
                count_shared(t, j, (b - a + segs[r][1] - segs[r][0]) * size)
                if b > a:
                    adapter.copy(part(r, a, b), adapter.slice(flat, start + a, start + b))
            barrier()   # every round is in
            lo, hi = segs[r]
            block = max(1, BLOCK_BYTES // size)
            for b in range(lo, hi, block):   # reduced in place, then published
                e = min(b + block, hi)
                mine = adapter.slice(flat, start + b, start + e)
                for j in others:
                    adapter.reduce(reduce_op, mine, part(j, b, e))
                if op == "mean":
                    adapter.divide(mine, n)
                adapter.copy(part(r, b, e), mine)   # (still in cache)
            barrier()   # every slice is reduced
            for j in others:
                a, b = segs[j]
                if b > a:
                    adapter.copy(adapter.slice(flat, start + a, start + b), part(j, a, b))
        for ticket in barrier.tickets:
            wait_sent(call, ticket)

    def close(self) -> None:
        self.views.close()
        self.arena.close()
