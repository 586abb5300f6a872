"""Allreduce among peers on one host through shared memory (issue #18): each peer copies its
array into its own arena (transport/shm_arena.py), the peers reduce slice r straight out of
every arena into its own array (its own slice never leaves it), publishes it in its arena,
and each copies the others' reduced slices out. Per peer and byte: (n-1)/n copied in, n reads
of 1/n (the reduce) and 1/n published while in cache, (n-1)/n copied out; no chunk hand-offs
through ZeroMQ messages and the I/O thread, as the ring's 2(n-1) steps make.

Rounds of at most ROUND_BYTES per peer keep the arena small (peak memory: the array plus two
rounds), alternating between the arena's two halves: a peer writes half h in round k only
after every peer's round k-1 began, which each began after reading half h in round k-2. Each
call starts with the peers' announcements of their arenas, as the call's first elements over
ZeroMQ (so a peer making another call, or of another size or dtype, is a ProtocolError on
every peer before anyone reads another's memory; it also says each finished the call before),
then two barriers a round: "my round is in", "my slice is reduced". A barrier is a counter in
each arena's header: a peer bumps its own after its writes and waits until every other's
reached the same step of this call (counted from the values announced, so a call that failed
half-way on some peers leaves nothing out of step), yielding the CPU, then sleeping, checking
its ZeroMQ mailboxes every millisecond for an abort or a lost peer, and giving up at the
call's deadline. Counters in shared memory rely on stores becoming visible in program order
(x86-64); elsewhere the barriers are empty chunks of the call over ZeroMQ. Every element is
reduced by one peer and copied to the others: the peers end bitwise identical. What a peer
reads of another's arena counts as bytes that other sent it (transport.counters), as the
ring's chunks would.
"""
from __future__ import annotations

import os
import platform
import time
from typing import Any

import numpy as np

from collectives.algorithms.p2p import Call, post_range, recv_range, wait_sent
from collectives.algorithms.ring import segments
from collectives.arrays.adapter import ArrayAdapter, adapter_for
from collectives.errors import PeerLost, ProtocolError
from collectives.transport.shm_arena import HEADER_BYTES, ArenaViews, ShmArena, counter_of

__all__ = ["OnHostAllreduce", "on_host", "ROUND_BYTES", "SHM_MIN_BYTES", "ANNOUNCEMENT_BYTES",
           "exchange_arenas", "SharedBarrier", "wait_counters", "check_mailbox", "count_shared"]

#: Bytes of each peer's array per round (the arena holds two).
ROUND_BYTES = 16 << 20
#: Reduce in blocks of this many bytes, every peer's block in turn (stays in cache).
BLOCK_BYTES = 256 << 10
#: The smallest array "auto" sends this way: below it the barriers' messages dominate.
SHM_MIN_BYTES = 1 << 20
#: (pid, fd, size, counter) as int64: an arena's announcement; the array holds at least this.
ANNOUNCEMENT_BYTES = 32
#: Barriers through the arenas' counters (x86-64's ordered stores), else over ZeroMQ.
SHARED_COUNTERS = platform.machine() in ("x86_64", "AMD64")


def on_host(transport: Any, adapter: ArrayAdapter, dtype: str, nbytes: int) -> bool:
    """The shared-memory allreduces can run: every other peer is on this host with shared
    memory, the array is in host memory, of a dtype numpy reads (not bfloat16), and holds an
    announcement. The same answer on every peer of one call."""
    others = set(range(transport.world_size)) - {transport.rank}
    try:
        np.dtype(dtype)
    except TypeError:
        return False
    return (adapter.on_host and bool(others) and others <= transport.on_host_peers()
            and nbytes >= ANNOUNCEMENT_BYTES)


class OnHostAllreduce:
    """A communicator's on-host allreduce: its arena and its mappings of the peers'."""

    def __init__(self, rank: int, order: Any) -> None:
        self.arena = ShmArena(rank)
        self.views = ArenaViews()
        self.order = order   # choice.py's SequenceOrder: one call at a time, in order

    def __call__(self, call: Call, adapter: ArrayAdapter, flat: Any, op: str) -> None:
        t = call.transport
        n, r = t.world_size, t.rank
        others = [j for j in range(n) if j != r]
        count, size = adapter.size(flat), call.itemsize
        per_round = max(1, min(count, ROUND_BYTES // size))
        half = per_round * size
        reduce_op = "sum" if op == "mean" else op
        with self.order.turn(call):
            arenas, bases = exchange_arenas(call, others, self.arena, self.views, 2 * half)
            barrier = SharedBarrier(call, adapter, flat, others, arenas, bases)
            tickets = []
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
            for ticket in tickets + barrier.tickets:
                wait_sent(call, ticket)

    def close(self) -> None:
        self.views.close()
        self.arena.close()


def exchange_arenas(call: Call, others: list[int], arena: ShmArena, views: ArenaViews,
                    nbytes: int) -> tuple[dict[int, np.ndarray], dict[int, int]]:
    """Announce this peer's ``arena`` (grown to ``nbytes`` of data) and map the others' into
    ``views``; their announcements also say they finished the call before (no one still reads
    here). Returns every peer's arena bytes and its counter as announced."""
    t = call.transport
    mine = arena.buffer(nbytes)
    # The announcement travels as the call's first elements (its 32 bytes read as the
    # call's dtype), so a peer whose call differs (op, dtype, shape) fails here, before a
    # byte of anyone's memory is read.
    k = -(-ANNOUNCEMENT_BYTES // call.itemsize)
    note = np.zeros(k * call.itemsize, dtype=np.uint8)
    note[:ANNOUNCEMENT_BYTES] = arena.announcement().view(np.uint8)
    note = note.view(np.dtype(call.dtype))
    na = adapter_for(note)
    tickets = [post_range(call, j, na, note, 0, k, track=True) for j in others]
    arenas = {t.rank: mine}
    bases = {t.rank: int(counter_of(mine)[0])}
    for j in _arrivals(call, others):   # in arrival order: a lost peer is named at once
        got = np.empty(k, dtype=np.dtype(call.dtype))
        for lo, hi, chunk in recv_range(call, j, na, 0, k):
            got[lo:hi] = chunk
        got = got.view(np.uint8)[:ANNOUNCEMENT_BYTES].view(np.int64)
        bases[j] = int(got[3])
        try:
            arenas[j] = views.view(j, got)
        except FileNotFoundError:
            raise PeerLost(f"rank {t.rank}: {call.describe()}: rank {j} ended (process "
                           f"{int(got[0])}) before its shared-memory arena was mapped",
                           rank=j, operation=call.describe()) from None
        except (OSError, ValueError) as exc:
            raise ProtocolError(f"rank {t.rank}: {call.describe()}: cannot map rank {j}'s "
                                f"shared-memory arena: {exc}") from None
        if arenas[j].size < nbytes + HEADER_BYTES:
            raise ProtocolError(f"rank {t.rank}: {call.describe()}: rank {j}'s arena holds "
                                f"{arenas[j].size} bytes, {nbytes} needed")
    for ticket in tickets:
        wait_sent(call, ticket)
    return arenas, bases


def count_shared(transport: Any, rank: int, nbytes: int) -> None:
    """``nbytes`` of this peer's arena that ``rank`` reads, in the traffic counters."""
    transport.counters[rank].bytes_sent += nbytes


def _arrivals(call: Call, others: list[int]):
    """The ranks of ``others`` as their first message of the call arrives (or their loss is
    known, or this peer closes: their recv raises); past the deadline, the first still silent
    (its recv raises the transport's timeout, which asks it where it is). Reads the socket
    in this thread while it waits, as a recv does (no hand-off to the I/O thread)."""
    t = call.transport
    pending = list(others)
    while pending:
        ready = [j for j in pending if t.inbox.poll((j, call.channel, call.seq))]
        now = time.monotonic()
        if ready or now >= call.deadline:
            j = (ready or pending)[0]
            pending.remove(j)
            yield j
            continue
        until = min(call.deadline, now + 0.005)
        if not t.pump((pending[0], call.channel, call.seq), until):   # another thread reads
            t.wait_any([(j, call.channel, call.seq) for j in pending], until)


class SharedBarrier:
    """The call's barriers: ``barrier()`` returns once every peer reached it (see the module
    docstring). ``tickets``: the ZeroMQ barriers' sends, to see through before returning."""

    def __init__(self, call: Call, adapter: ArrayAdapter, flat: Any, others: list[int],
                 arenas: dict[int, np.ndarray], bases: dict[int, int]) -> None:
        self.call, self.adapter, self.flat, self.others = call, adapter, flat, others
        self.counters = {j: counter_of(a) for j, a in arenas.items()}
        self.bases, self.step, self.tickets = bases, 0, []

    def __call__(self) -> None:
        call, others = self.call, self.others
        if not SHARED_COUNTERS:   # empty chunks of the call, each way
            self.tickets += [tk for tk in (post_range(call, j, self.adapter, self.flat, 0, 0)
                                           for j in others) if tk is not None]
            for j in others:
                for _ in recv_range(call, j, self.adapter, 0, 0):
                    pass
            return
        self.step += 1
        me = call.transport.rank
        self.counters[me][0] = self.bases[me] + self.step   # after this peer's writes
        wait_counters(call, self.counters, {j: self.bases[j] + self.step for j in others},
                      f"step {self.step} of the shared-memory allreduce")


def wait_counters(call: Call, counters: dict[int, np.ndarray], targets: dict[int, int],
                  what: str) -> None:
    """Return once ``counters[j][0] >= targets[j]`` for every j: yielding the CPU, then
    sleeping, checking the call's mailboxes every millisecond for what a peer we wait for
    sent instead (an abort: raised as the transport words it; a chunk: ProtocolError) or its
    loss (PeerLost), and raising OperationTimeout at the call's deadline."""
    pending = [j for j, target in targets.items() if counters[j][0] < target]
    spins, check_at = 0, 0.0
    while pending:
        spins += 1
        if spins > 256:
            now = time.monotonic()
            if now >= check_at:
                _check(call, pending, now, what)
                check_at = now + 0.001
            time.sleep(min(1e-4, 1e-6 * spins))   # (short sleeps: the late peer is close)
        else:
            os.sched_yield()
        pending = [j for j in pending if counters[j][0] < targets[j]]


def _check(call: Call, pending: list[int], now: float, what: str) -> None:
    check_mailbox(call, pending)
    if now >= call.deadline:
        # The transport's own timeout, which asks the peer where it is ("has not started
        # allreduce ... idle since ..."), as any wait on it would.
        t = call.transport
        header, _, release = t.recv(pending[0], call.channel, call.seq,
                                    deadline=call.deadline, operation=call)
        if release is not None:
            release()
        raise call.mismatch(pending[0], header, f"a message instead of reaching {what}")


def check_mailbox(call: Call, ranks: list[int]) -> None:
    """Raise what one of ``ranks`` sent for this call over ZeroMQ while we wait for it in
    shared memory (an abort, as the transport words it; a chunk: ProtocolError), or its loss
    (PeerLost); return if nothing came."""
    t = call.transport
    for j in ranks:
        if t.inbox.poll((j, call.channel, call.seq)):
            header, _, release = t.recv(j, call.channel, call.seq, deadline=call.deadline,
                                        operation=call)
            if release is not None:
                release()
            raise call.mismatch(j, header, "a message during a shared-memory wait")
