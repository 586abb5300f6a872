"""Neighbour allgather (BlueFog's ``neighbor_allgather``): each peer sends its ``x`` to the
peers of ``dst_ranks`` and gets the arrays of the peers of ``src_ranks``, concatenated along
the first axis in the order ``src_ranks`` gives them (BlueFog's order; a rank named twice
counts once, where it is first named). Only the peers named take part (a directed or
time-varying pattern is fine); the arrays' first dimensions may differ between peers, the
rest of the shape and the dtype may not.

Each message to a destination starts with this peer's element count (one int64, which also
carries the pairing plan of algorithms/pattern.py), then the data. So a pattern that does not
pair (j in my sources iff I am in j's destinations) is a ValueError on the peers involved,
naming both ranks; a dtype or trailing shape that differs is a ProtocolError naming both
calls (they are part of the signature); a data message of another size than its count
announced is a ProtocolError too.

When every peer is on this host (and the shared-memory entry is mapped: choice.py's
neighbors_in_slots), the call goes through the entry instead (OnHostNeighbors.allgather in
algorithms/shm_neighbor.py): no message at all; each peer's pattern and array in its slot
(an array that does not fit is read out of its owner's memory, or sent where peers cannot
read each other), its count and whether it is in the slot in its header, and the pairing
checked from the patterns with the same errors.

Otherwise, on one host, from READ_MIN_BYTES, a sender offers its array to be read instead (its count
message then also carries its pid and the array's address, and no data follows): the
destination reads it straight out of the sender's memory (transport/cma.py) into its output,
tells the sender it is done, and keeps what it read once the sender answers that every
reader is done (as algorithms/neighbor_direct.py's readers do), so no sender returns while
its array is read, and a sender that failed is an error, never a silent read of freed
memory. Each sender chooses for itself, its count message says which, so peers whose arrays
differ in size need not agree.
"""
from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from collectives.algorithms.choice import gather_may_use_slots, neighbors_in_slots
from collectives.algorithms.neighbor import refuse
from collectives.algorithms.p2p import Call, post_range, recv_range, wait_reached, wait_sent
from collectives.algorithms.pattern import announce, check_pairing, plan_bits
from collectives.algorithms.shm_allreduce import on_host
from collectives.algorithms.neighbor_direct import empty_chunk
from collectives.algorithms.shm_direct import address_of, read_range
from collectives.algorithms.shm_entry import count_shared
from collectives.algorithms.shm_neighbor import SLOTS_SIGNATURE
from collectives.arrays.adapter import adapter_for
from collectives.engine import Engine
from collectives.errors import ProtocolError
from collectives.staging import Staging
from collectives.transport import cma
from collectives.transport.wire import dtype_itemsize

__all__ = ["neighbor_allgather", "READ_MIN_BYTES"]

#: The smallest array a sender on this host offers to be read rather than sent (below, the
#: two messages more of a read cost more than the copies they save).
READ_MIN_BYTES = 1 << 20
#: The count message's elements (int64): count, pid, address.
_NOTE = 3


def _offers_reads(engine: Engine, adapter: Any, dtype: str, count: int, dsts: list[int]) -> bool:
    """Whether this peer offers its array to be read by its destinations: from
    READ_MIN_BYTES, every destination on this host with shared memory, an array in host
    memory numpy reads, and every peer able to read every other's memory, as the last
    shared-memory entry said (before any, never)."""
    nbytes = count * dtype_itemsize(dtype)
    return (nbytes >= READ_MIN_BYTES and engine.on_host.entry.direct is True
            and on_host(engine.transport, adapter, dtype, nbytes, dsts))


def _read(call: Call, src: int, where: tuple[int, int], adapter: Any, out: Any, at: int,
          count: int, *, itemsize: int) -> None:
    """``count`` elements of ``itemsize`` bytes of rank src's array, at ``where``, into
    ``out[at:]`` (the array's itemsize, not the call's: the call is the int64 count
    message's)."""
    read_range(cma.Reader(), call, src, where, 0, address_of(adapter, out, at),
               count * itemsize)


def neighbor_allgather(engine: Engine, x: Any, src_ranks, dst_ranks, wait: bool,
                       timeout: float | None) -> Any:
    """The in-neighbours' ``x`` concatenated along the first axis (in ``src_ranks``' order), of
    shape (sum of their first dims, *x.shape[1:]); an empty array (first dim 0) when
    ``src_ranks`` is empty. A Work handle with ``wait=False``."""
    adapter, flat, dtype = Staging().flat(x, written=False)
    r, n = engine.rank, engine.world_size
    given = list(dict.fromkeys(int(s) for s in src_ranks))   # the result's order
    srcs, dsts = sorted(given), sorted({int(d) for d in dst_ranks})
    for p in srcs + dsts:
        if not 0 <= p < n or p == r:
            raise ValueError(f"rank {r}: neighbour {p} is not another peer of the {n}")
    shape = tuple(x.shape)
    rest = shape[1:]
    row = int(np.prod(rest, dtype=np.int64)) if rest else 1
    count = adapter.size(flat)
    peers = sorted(set(srcs) | set(dsts))
    # The dtype and trailing shape are in the signature: peers that differ in either meet
    # a call of another signature (ProtocolError naming both) at the count message.
    signature = f"neighbor_allgather({dtype}{list(rest)})"
    slots = gather_may_use_slots(engine.on_host, engine.transport, adapter=adapter, dtype=dtype)
    offer = bool(dsts) and _offers_reads(engine, adapter, dtype, count, dsts)
    itemsize = dtype_itemsize(dtype)
    seq = engine.next_seq("shm" if slots else "")
    result = [None]

    def whole_rows(call: Call, counts: dict[int, int]) -> None:
        for src, got in counts.items():
            if got % row:   # its own x is whole rows: only a broken sender
                raise ProtocolError(f"rank {r}: {call.describe()}: rank {src} announced "
                                    f"{got} elements, not whole rows of {list(rest)}")

    def through_entry(call: Call) -> None:
        out, counts = engine.on_host.neighbors.allgather(call, adapter, flat, srcs, dsts, given)
        whole_rows(call, counts)
        result[0] = out.reshape((adapter.size(out) // row,) + rest)

    def run(call: Call) -> None:
        # The count message: the count, and where a destination may read the array (pid and
        # address; 0 and 0 when the data follows instead).
        address = address_of(adapter, flat) if offer else 0
        mine = np.array([count, os.getpid() if offer else 0, address], dtype=np.int64)
        np_adapter = adapter_for(mine)
        data = Call(call.transport, call.channel, call.seq, signature + "[data]", dtype,
                    (count,), call.deadline)
        announce(call, peers, srcs, dsts)
        tickets = []
        for dst in dsts:
            # The count carries the plan; the data follows on the same pipe, in order.
            tickets.append(post_range(call, dst, np_adapter, mine, 0, _NOTE, track=True,
                                      plan=plan_bits(dst, srcs, dsts)))
            if offer:
                count_shared(call.transport, dst, count * itemsize)
            else:
                tickets.append(post_range(data, dst, adapter, flat, 0, count, track=True))
        problems = check_pairing(call, peers, srcs, dsts)
        if problems:
            refuse(call, peers, problems, tickets)
        counts, where = {}, {}
        for src in srcs:
            note = np.empty(_NOTE, np.int64)
            for lo, hi, chunk in recv_range(call, src, np_adapter, 0, _NOTE):
                note[lo:hi] = chunk
            counts[src] = int(note[0])
            if note[1]:
                where[src] = (int(note[1]), int(note[2]))
        whole_rows(call, counts)
        total = sum(counts.values())
        out = adapter.empty(total, dtype, flat)
        starts, at = {}, 0
        for src in given:
            starts[src] = at
            at += counts[src]
        theirs = {src: Call(call.transport, call.channel, call.seq, signature + "[data]", dtype,
                            (counts[src],), call.deadline) for src in srcs}
        for src in srcs:
            at = starts[src]
            if src in where:
                _read(call, src, where[src], adapter, out, at, counts[src], itemsize=itemsize)
                tickets.append(post_range(theirs[src], src, adapter, flat, 0, 0))   # done
            else:
                for a, b, chunk in recv_range(theirs[src], src, adapter, 0, counts[src]):
                    adapter.copy(adapter.slice(out, at + a, at + b), chunk)
        if offer:   # every reader is done with this peer's array, and is told so: what it
            for dst in dsts:   # read was this array, still in the call
                empty_chunk(data, dst, adapter)
                tickets.append(post_range(data, dst, adapter, flat, 0, 0))
        for src in where:
            empty_chunk(theirs[src], src, adapter)
        for ticket in tickets:
            if ticket is not None:
                wait_sent(call, ticket)
        for dst in dsts:
            if dst not in srcs:   # nothing else notices a destination that died unreached
                wait_reached(call, dst)
        result[0] = out.reshape((total // row,) + rest)

    def body() -> Any:
        deadline = time.monotonic() + (engine.timeout if timeout is None else timeout)
        if slots and neighbors_in_slots(engine.on_host, engine.transport, seq, deadline,
                                        operation="neighbor_allgather"):
            # On one host, through the shared-memory entry (every peer enters it, with its
            # own neighbours): no ZeroMQ message (OnHostNeighbors.allgather).
            engine.execute(seq, signature + SLOTS_SIGNATURE, dtype, (1,), timeout, peers,
                           through_entry, neighbours=True)
        else:
            # Even with no neighbours the call begins: a peer that names this one is answered
            # "not involved" (transport/activity.py) instead of waiting out its timeout.
            engine.execute(seq, signature, "int64", (_NOTE,), timeout, peers, run,
                           neighbours=True)
        adapter.synchronize()
        return result[0]
    return engine.launch(f"{signature} seq {seq}", body, wait)

