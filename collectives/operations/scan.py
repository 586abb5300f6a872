"""Prefix reductions of a Communicator (MPI's ``MPI_Scan`` and ``MPI_Exscan``), run through
its Engine: peer r's ``x`` becomes the reduction of peers 0..r's arrays (``scan``) or of
peers 0..r-1's (``exscan``; rank 0's ``x`` becomes the op's identity, where MPI leaves it
undefined: 0 for sum, bor and bxor, 1 for prod, all bits for band, the dtype's lowest value
for max and its highest for min; so an exclusive sum of counts is each peer's offset).

Recursive doubling (Hillis and Steele): in round k each peer sends its partial reduction
(of the peers r - 2^k + 1 .. r) to peer r + 2^k and combines the one of peer r - 2^k into
its own, so a scan takes ceil(log2 n) rounds and each peer sends at most that many arrays.
The ops are the reductions' own (sum, prod, max, min, band, bor, bxor), each commutative and
associative, so the order of combination changes nothing but a float sum's rounding; a
prefix ``mean`` is no such reduction and is refused (``scan(x, "sum")`` divided by rank + 1
is one). A peer holds two arrays beside ``x`` while it runs (what it receives, and the
reduction it builds; an ``exscan`` three: the partial it sends on too), since what it sent
must stay unchanged until the network has it, and ``x`` is written only once the call
succeeded: a call that fails leaves ``x`` as it was (as a failed allreduce leaves each
element as it was or at its result, never a partial one).

Every peer must make the same call (op, dtype, size): each message's header is checked
against the receiver's call, so a mismatch is a ProtocolError naming both calls on the peers
it reaches and, through the abort, on the others: the call ends with a dissemination barrier
of its own, so no peer returns before every peer's call has matched. ``wait=False`` returns a
Work.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from collectives.algorithms.barrier import dissemination_barrier
from collectives.algorithms.p2p import Call, post_range, recv_range, wait_sent
from collectives.arrays.adapter import check_reduce_op
from collectives.engine import Engine
from collectives.staging import Staging

__all__ = ["scan"]


def scan(engine: Engine, x: Any, op: str, exclusive: bool, wait: bool,
         timeout: float | None) -> Any:
    """Reduce peers 0..r's ``x`` (0..r-1's with ``exclusive``) into peer r's, in place;
    returns ``x`` (a Work with ``wait=False``)."""
    name = "exscan" if exclusive else "scan"
    stage = Staging()
    adapter, flat, dtype = stage.flat(x, written=True)
    check_reduce_op(op, dtype)
    if op == "mean":
        raise ValueError(f"rank {engine.rank}: {name}(op='mean'): a prefix mean is not a "
                         "reduction MPI scans; scan with op='sum' and divide by rank + 1")
    n, r = engine.world_size, engine.rank
    count = adapter.size(flat)
    seq = engine.next_seq()
    signature = f"{name}({op})"

    def run(call: Call) -> None:
        received = adapter.empty(count, dtype, flat) if r > 0 else None   # (rank 0 hears none)
        work = adapter.clone(flat)   # (reduced aside: x gets it at the end)
        # What goes to r + d: the partial over r - d + 1 .. r (work itself for a scan, which
        # holds it; a copy for an exscan, whose work holds the partial over r - d + 1 ..
        # r - 1).
        # (An exscan peer that sends nothing, r + 1 = n, keeps no partial.)
        partial = adapter.clone(work) if exclusive and r + 1 < n else work
        heard = False
        if exclusive and r == 0:
            _fill_identity(adapter, work, op, dtype, count)
        d = 1
        while d < n:
            ticket = (post_range(call, r + d, adapter, partial, 0, count, track=True)
                      if r + d < n else None)
            if r - d >= 0:
                for lo, hi, chunk in recv_range(call, r - d, adapter, 0, count):
                    adapter.copy(adapter.slice(received, lo, hi), chunk)
            wait_sent(call, ticket)   # (what was sent may change now)
            if r - d >= 0:
                if not exclusive or r + 2 * d < n:   # (an exscan's partial: only if sent on)
                    adapter.reduce(op, partial, received)
                if exclusive:
                    if heard:
                        adapter.reduce(op, work, received)
                    else:
                        adapter.copy(work, received)
                heard = True
            d *= 2
        # Data flows up the ranks only: a peer that refused the call (a mismatch) would not
        # stop the ranks below it from returning. The barrier closing the call carries its
        # signature, and no peer leaves it before every peer has arrived (or raises the
        # abort of the one that refused): broadcast's rule (algorithms/broadcast.py).
        dissemination_barrier(call)
        adapter.copy(flat, work)

    def body() -> Any:
        if n > 1:
            engine.execute(seq, signature, dtype, (count,), timeout, engine.peers, run)
        elif exclusive:   # (alone: rank 0)
            _fill_identity(adapter, flat, op, dtype, count)
        adapter.synchronize()
        return x
    return engine.launch(f"{signature} seq {seq}", body, wait, stage)


def _fill_identity(adapter: Any, flat: Any, op: str, dtype: str, count: int) -> None:
    """``flat`` (of any array family) set to ``op``'s identity element in ``dtype``."""
    one = _identity(op, dtype)
    host = bytearray(np.full(count, one[0], one.dtype).tobytes())   # (writable: torch's)
    adapter.copy(flat, adapter.from_frame(host, dtype, count))


def _identity(op: str, dtype: str) -> np.ndarray:
    """One element: ``op``'s identity in ``dtype`` (bfloat16 as its 16 bits)."""
    if dtype == "bfloat16":   # (numpy has none: the upper half of the float32's bits)
        return (_identity(op, "float32").view(np.uint32) >> 16).astype(np.uint16)
    dt = np.dtype(dtype)
    if op in ("sum", "bor", "bxor"):
        value: Any = 0
    elif op == "prod":
        value = 1
    elif dt == np.bool_:
        value = op in ("band", "min")
    elif op == "band":
        value = np.iinfo(dt).max if dt.kind == "u" else -1
    elif dt.kind == "f":
        value = -np.inf if op == "max" else np.inf
    else:
        info = np.iinfo(dt)
        value = info.min if op == "max" else info.max
    return np.array([value], dt)
