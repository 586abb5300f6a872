"""Neighbour allgather (BlueFog's ``neighbor_allgather``): each peer sends its ``x`` to the
peers of ``dst_ranks`` and gets the arrays of the peers of ``src_ranks``, concatenated along
the first axis in ascending rank order. Only the peers named take part (a directed or
time-varying pattern is fine); the arrays' first dimensions may differ between peers, the
rest of the shape and the dtype may not.

Each message to a destination starts with this peer's element count (one int64, which also
carries the pairing plan of algorithms/pattern.py), then the data. So a pattern that does not
pair (j in my sources iff I am in j's destinations) is a ValueError on the peers involved,
naming both ranks; a dtype or trailing shape that differs is a ProtocolError naming both
calls (they are part of the signature); a data message of another size than its count
announced is a ProtocolError too.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from collectives.algorithms.neighbor import refuse
from collectives.algorithms.p2p import Call, post_range, recv_range, wait_reached, wait_sent
from collectives.algorithms.pattern import announce, check_pairing, plan_bits
from collectives.arrays.adapter import adapter_for
from collectives.engine import Engine
from collectives.errors import ProtocolError
from collectives.staging import Staging

__all__ = ["neighbor_allgather"]


def neighbor_allgather(engine: Engine, x: Any, src_ranks, dst_ranks, wait: bool,
                       timeout: float | None) -> Any:
    """The in-neighbours' ``x`` concatenated along the first axis (ascending rank), of
    shape (sum of their first dims, *x.shape[1:]); an empty array (first dim 0) when
    ``src_ranks`` is empty. A Work handle with ``wait=False``."""
    adapter, flat, dtype = Staging().flat(x, written=False)
    r, n = engine.rank, engine.world_size
    srcs, dsts = sorted({int(s) for s in src_ranks}), sorted({int(d) for d in dst_ranks})
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
    seq = engine.next_seq()
    result = [None]

    def run(call: Call) -> None:
        mine = np.array([count], dtype=np.int64)
        np_adapter = adapter_for(mine)
        data = Call(call.transport, call.channel, call.seq, signature + "[data]", dtype,
                    (count,), call.deadline)
        announce(call, peers, srcs, dsts)
        tickets = []
        for dst in dsts:
            # The count carries the plan; the data follows on the same pipe, in order.
            tickets.append(post_range(call, dst, np_adapter, mine, 0, 1, track=True,
                                      plan=plan_bits(dst, srcs, dsts)))
            tickets.append(post_range(data, dst, adapter, flat, 0, count, track=True))
        problems = check_pairing(call, peers, srcs, dsts)
        if problems:
            refuse(call, peers, problems, tickets)
        counts = {}
        for src in srcs:
            for _, _, chunk in recv_range(call, src, np_adapter, 0, 1):
                counts[src] = int(chunk[0])
            if counts[src] % row:   # its own x is whole rows: only a broken sender
                raise ProtocolError(f"rank {r}: {call.describe()}: rank {src} announced "
                                    f"{counts[src]} elements, not whole rows of {list(rest)}")
        total = sum(counts.values())
        out = adapter.empty(total, dtype, flat)
        at = 0
        for src in srcs:
            theirs = Call(call.transport, call.channel, call.seq, signature + "[data]", dtype,
                          (counts[src],), call.deadline)
            for a, b, chunk in recv_range(theirs, src, adapter, 0, counts[src]):
                adapter.copy(adapter.slice(out, at + a, at + b), chunk)
            at += counts[src]
        for ticket in tickets:
            wait_sent(call, ticket)
        for dst in dsts:
            if dst not in srcs:   # nothing else notices a destination that died unreached
                wait_reached(call, dst)
        result[0] = out.reshape((total // row,) + rest)

    def body() -> Any:
        # Even with no neighbours the call begins: a peer that names this one is answered
        # "not involved" (transport/activity.py) instead of waiting out its timeout.
        engine.execute(seq, signature, "int64", (1,), timeout, peers, run, neighbours=True)
        adapter.synchronize()
        return result[0]
    return engine.launch(f"{signature} seq {seq}", body, wait)

