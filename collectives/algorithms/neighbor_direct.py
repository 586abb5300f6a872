"""The neighbour exchange on one host without copying the array (issue #18): instead of its
array, a peer sends each destination a three-word note (its pid, the array's address, the
destination's weight), and each destination reads the array straight out of the sender's
memory (transport/cma.py) into a cache-sized block, adding it into its accumulator. A reader
then tells the sender it is done (an empty chunk of the call); a sender changes its array
(the combine) only once every destination is done, and answers each (another empty chunk),
which tells the reader that what it read was that array, still in the call: a sender that
failed and returned (its array freed, its memory perhaps reused) never answers, so its
readers raise its abort instead of keeping what they read. Only the peers of the exchange
wait for each other, as in the copying exchange.

The note is the call's first data chunk to each destination, so the pairing check
(pattern.py) rides on it unchanged. Peers choose this way alike (the exchange decides from
what every peer saw: operations/neighbor_allreduce.py) and the signature says so, so a peer
that copies meets a ProtocolError, never a misread note. Not for ``partial`` rounds (a lost
peer's memory cannot be read; push-sum's rule needs the copying exchange's accounting).
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from collectives.algorithms.neighbor import combine, refuse
from collectives.algorithms.p2p import Call, post_range, recv_range, wait_sent
from collectives.algorithms.pattern import announce, check_pairing, plan_bits
from collectives.algorithms.shm_direct import BLOCK_BYTES, read_peer
from collectives.algorithms.shm_entry import count_shared
from collectives.arrays.adapter import ArrayAdapter, adapter_for
from collectives.neighbor_plan import NeighborPlan
from collectives.transport import cma

__all__ = ["direct_exchange", "DIRECT_NEIGHBOR_MIN_BYTES", "DIRECT_SIGNATURE"]

#: The smallest array exchanged this way: below, the copies through the rings cost as much as
#: pinning the sender's pages for every read (ring of 4 on 2 cores, `gossip bench neighbor`:
#: 4 MiB 7.4-9.8 ms read against 5.9-7.6 ms copied, 8 MiB 10.1 against 14.0, 16 MiB 18.1
#: against 24.8, 64 MiB 72.9 against 87.9).
DIRECT_NEIGHBOR_MIN_BYTES = 8 << 20
#: What the signature carries when the exchange goes this way.
DIRECT_SIGNATURE = "+direct"

_NOTE_BYTES = 24   # pid, address (int64), weight (float64)


def direct_exchange(call: Call, adapter: ArrayAdapter, flat: Any, plan: NeighborPlan, *,
                    scratch: Any, reader: cma.Reader, out: Any = None) -> dict[int, Exception]:
    """neighbor_exchange's result (algorithms/neighbor.py), reading the sources' arrays."""
    src_weights, dst_ranks, dst_weights = plan.src_weights, plan.dst_ranks, plan.dst_weights
    checked = plan.check_pattern
    t = call.transport
    size, itemsize = adapter.size(flat), call.itemsize
    peers = plan.peers
    if checked:
        announce(call, peers, src_weights, dst_ranks)
    address = np.frombuffer(adapter.send_buffer(flat, 0, 1), np.uint8).ctypes.data
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
    acc = scratch if out is None else out
    block = max(1, BLOCK_BYTES // itemsize)
    buffer = np.empty(min(block, size) * itemsize, np.uint8)
    first = True
    for src in sorted(src_weights):
        got = np.empty(k, np.dtype(call.dtype))
        for lo, hi, chunk in recv_range(call, src, adapter_for(got), 0, k):
            got[lo:hi] = chunk
        raw = got.view(np.uint8)
        pid, where = (int(v) for v in raw[:16].view(np.int64))
        weight = src_weights[src] * float(raw[16:24].view(np.float64)[0])
        for a in range(0, size, block):
            b = min(a + block, size)
            read_peer(reader, call, src, (pid, where), a * itemsize, buffer.ctypes.data,
                      (b - a) * itemsize)
            part = adapter.from_frame(buffer[:(b - a) * itemsize], call.frame_dtype, b - a)
            if first:
                adapter.scaled_copy(adapter.slice(acc, a, b), weight, part)
            else:
                adapter.axpy(adapter.slice(acc, a, b), weight, part)
        first = False
        tickets.append(post_range(call, src, adapter, flat, 0, 0))   # "done"
    for dst in dst_ranks:   # every reader of this peer's array is done with it, and is told
        _empty_chunk(call, dst, adapter)   # its reads were of this array, still in the call
        tickets.append(post_range(call, dst, adapter, flat, 0, 0))
    for src in sorted(src_weights):   # ... and so was every array read here
        _empty_chunk(call, src, adapter)
    for ticket in tickets:
        if ticket is not None:
            wait_sent(call, ticket)
    combine(adapter, flat, plan.self_weight, scratch, out, heard=not first)
    return {}


def _empty_chunk(call: Call, src: int, adapter: ArrayAdapter) -> None:
    for _ in recv_range(call, src, adapter, 0, 0):
        pass
