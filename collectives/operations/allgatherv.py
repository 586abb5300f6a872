"""Allgather of parts of any size (MPI's Allgatherv; ``Communicator.allgather(variable=True)``):
every peer's flat ``x``, in rank order, in one buffer (the caller's ``out`` if given, else a
new one), returned as a list of n views into it.

Every peer's size (and its out='s, -1 for none) reaches every other before any part moves, and
every peer checks every out= against the sum of the parts, so an out= that cannot hold them is
the same ProtocolError on every peer, naming its rank, and the group goes on. On one host the
sizes travel with the shared-memory entry (each peer's words in its slot, its part after them
where every part fits a slot: OnHostCopies.exchange), and the parts are copied out of the slots
or read straight out of the peers' arrays. Elsewhere the sizes go around the ZeroMQ ring first
(algorithms/allgather.exchange_counts), then the parts (ring_allgather_into).

Whether the call runs on one host is decided from the placement and the dtype alone, never
from this peer's size, so every peer decides alike.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from collectives.algorithms.allgather import exchange_counts, ring_allgather_into
from collectives.algorithms.choice import COPIES_SIGNATURE, on_host_copies
from collectives.algorithms.p2p import Call
from collectives.algorithms.shm_copies import CallArrays
from collectives.algorithms.shm_entry import ANNOUNCEMENT_BYTES
from collectives.arrays.interface import ArrayAdapter
from collectives.engine import Engine
from collectives.errors import ProtocolError
from collectives.staging import Staging
from collectives.transport.wire import dtype_itemsize

__all__ = ["allgather_variable"]


def allgather_variable(engine: Engine, x: Any, out: Any, wait: bool,
                       timeout: float | None) -> Any:
    """The parts of every peer's ``x`` (flat), as a list of n views into one buffer: ``out``
    if given (of the sum of the peers' sizes), else a new one. A Work with ``wait=False``."""
    stage = Staging()
    adapter, flat, dtype = stage.flat(x, written=False)
    n = engine.world_size
    count = adapter.size(flat)
    out_flat = None
    if out is not None:
        # Its family, dtype and layout are checked here (a refusal is a call of its own:
        # Engine.refuse); its size only the call can check (the parts' sum is known once
        # every peer's size is: _buffer, on every peer, for every peer's out=).
        out_flat = engine.out_like(adapter, dtype, int(np.prod(tuple(out.shape))), out,
                                   "allgather(variable=True)", "the sum of the peers' sizes",
                                   stage)
        if stage and len(tuple(out.shape)) != 1:
            # The parts come back as views of out=: a non-contiguous array of more than one
            # dimension has none (its elements in order are not one stride apart).
            engine.refuse(ValueError(
                f"rank {engine.rank}: allgather(variable=True): out must be contiguous or "
                f"one-dimensional (the parts are returned as views of it), got a "
                f"non-contiguous array of shape {tuple(out.shape)}"), "allgather(variable)")
    copies = on_host_copies(engine.on_host, engine.transport, adapter, dtype,
                            ANNOUNCEMENT_BYTES)
    seq = engine.next_seq("shm" if copies else "")
    signature = "allgather(variable)" + (COPIES_SIGNATURE if copies else "")
    # On one host the call's own shape holds the arenas' announcement, which travels as its
    # first elements; it is only compared, the same on every peer.
    shape = (-(-ANNOUNCEMENT_BYTES // dtype_itemsize(dtype)),) if copies else (count,)
    # This peer's words for the others: its size, and its out='s (-1: none given).
    words = np.array([count, -1 if out_flat is None else adapter.size(out_flat)],
                     dtype=np.int64)
    result: list[list[Any]] = []

    def run(call: Call) -> None:
        def gather(rows: np.ndarray, read: CallArrays | None) -> None:
            buf, bounds = _buffer(call, adapter, flat, out_flat, rows)
            if read is None:
                _around_the_ring(call, adapter, flat, buf, bounds)
            else:
                _read_parts(read, adapter, flat, buf, bounds, rank=engine.rank)
            # (views of out= itself where it is staged: a one-dimensional strided array,
            # which takes the parts from its stand-in as the call returns)
            into = out if stage else buf
            result.append([adapter.slice(into, bounds[i], bounds[i + 1]) for i in range(n)])
        if copies is None or n == 1:
            gather(exchange_counts(call, words.tolist()), None)
        else:
            copies.exchange(call, adapter, flat, words, lambda peers, rows: gather(rows, peers),
                            lambda rows: gather(rows, None))

    def body() -> Any:
        if n == 1:
            run(engine.call(seq, signature, dtype, shape, time.monotonic() + engine.timeout))
        else:
            engine.execute(seq, signature, dtype, shape, timeout, engine.peers, run)
        adapter.synchronize()
        return result[0]
    return engine.launch(f"{signature} seq {seq}", body, wait, stage)


def _buffer(call: Call, adapter: ArrayAdapter, flat: Any, out_flat: Any,
            rows: np.ndarray) -> tuple[Any, list[int]]:
    """The buffer the parts go into (``out_flat``, else a new one) and where each starts, then
    the end: from every peer's words (``rows``). Every peer's out= must hold the parts: if
    one does not, every peer raises the same ProtocolError, naming it."""
    bounds = np.concatenate([[0], np.cumsum(rows[:, 0])]).tolist()
    bad = [f"rank {j}'s out= holds {rows[j, 1]} elements" for j in range(rows.shape[0])
           if 0 <= rows[j, 1] != bounds[-1]]
    if bad:
        raise ProtocolError(f"rank {call.transport.rank}: {call.describe()}: the parts are "
                            f"{bounds[-1]} elements, but {'; '.join(bad)}")
    buf = adapter.empty(bounds[-1], call.dtype, flat) if out_flat is None else out_flat
    return buf, bounds


def _around_the_ring(call: Call, adapter: ArrayAdapter, flat: Any, buf: Any,
                     bounds: list[int]) -> None:
    """The parts over the ZeroMQ ring, each chunk checked against the whole buffer."""
    data = Call(call.transport, call.channel, call.seq, call.signature, call.dtype,
                (bounds[-1],), call.deadline)
    ring_allgather_into(data, adapter, flat, buf,
                        [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)])


def _read_parts(peers: CallArrays, adapter: ArrayAdapter, flat: Any, buf: Any,
                bounds: list[int], *, rank: int) -> None:
    """On one host: each other peer's part out of its slot or its array, this peer's
    (``rank``'s) own copied."""
    r = rank
    for j in range(len(bounds) - 1):
        if j != r:
            peers.copy(j, 0, buf, bounds[j], bounds[j + 1])
    adapter.copy(adapter.slice(buf, bounds[r], bounds[r + 1]), flat)
