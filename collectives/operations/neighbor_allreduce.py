"""The neighbour exchange as a call of the group (D-PSGD's and push-sum's round,
``Communicator.neighbor_exchange``): only the peers a NeighborPlan names take part, its pattern
checked before the data is combined. The plan says what to do; this module prepares the
buffers, takes the sequence number, picks the way the data moves and runs it through the
communicator's Engine:

- copied through the transport (algorithms/neighbor.py), the general way;
- read straight from the sources' memory on one host, for large arrays
  (algorithms/neighbor_direct.py; every peer of the exchange decides alike);
- through the slots of the shared-memory entry on one host, for small arrays
  (algorithms/shm_neighbor.py: every peer of the communicator enters the round);
- as encodings, when the plan has a codec (algorithms/compressed.py): ``x <- w_self D(E(x))
  + sum_j w_j D(E(x_j))``, summed in float32 (float64 for float64 arrays). The codec is part of
  the signature and of the header's dtype, so peers that pass different codecs (or one none)
  get a ProtocolError.

A partial round (``plan.partial``) that completed without some peers raises ExchangeIncomplete
afterwards, with the result in place; nothing is aborted then.
"""
from __future__ import annotations

import time
from typing import Any

from collectives.algorithms.choice import (neighbors_in_slots, neighbors_may_use_slots,
                                           neighbors_read_directly)
from collectives.algorithms.compressed import CodecStats, compressed_exchange
from collectives.algorithms.neighbor import UNCHECKED, incomplete, neighbor_exchange
from collectives.algorithms.neighbor_direct import DIRECT_SIGNATURE, direct_exchange
from collectives.algorithms.shm_neighbor import SLOTS_SIGNATURE
from collectives.codecs.float32 import as_float32, write_back
from collectives.codecs.catalog import wire_dtype
from collectives.codecs.codec import Codec
from collectives.engine import Engine
from collectives.neighbor_plan import NeighborPlan
from collectives.staging import Staging, flat_of
from collectives.transport import cma
from collectives.transport.wire import dtype_itemsize

__all__ = ["neighbor_allreduce"]


def neighbor_allreduce(engine: Engine, x: Any, plan: NeighborPlan, *, scratch: Any, out: Any,
                       wait: bool, timeout: float | None, stats: CodecStats) -> Any:
    """Communicator.neighbor_exchange: ``plan`` on ``x`` (in place, or into ``out``);
    ``scratch`` a buffer like ``x`` for what arrives (else allocated); ``stats`` counts what a
    codec encoded."""
    if plan.compression is not None:
        return _compressed(engine, x, plan, plan.compression, out=out, wait=wait,
                           timeout=timeout, stats=stats)
    stage = Staging()
    adapter, flat, dtype = stage.flat(x, written=out is None or out is x)
    plan.check(engine.rank, engine.world_size, dtype)
    out_flat = None
    if out is x:
        out = None   # in place, as without out (a separate out must not overlap x)
    if out is not None:
        out_flat = engine.out_like(adapter, dtype, adapter.size(flat), out,
                                   "neighbor_allreduce", "like x", stage)
    elif scratch is None:
        scratch = adapter.empty(adapter.size(flat), dtype, flat)
    if scratch is not None:
        scratch = engine.out_like(adapter, dtype, adapter.size(flat), scratch,
                                  "neighbor_allreduce", "scratch like x")
    nbytes = adapter.size(flat) * dtype_itemsize(dtype)
    may_use_slots = neighbors_may_use_slots(engine.on_host, engine.transport, plan,
                                            adapter=adapter, dtype=dtype, nbytes=nbytes)
    seq = engine.next_seq("shm" if may_use_slots else "")
    peers = plan.peers

    def body() -> Any:
        deadline = time.monotonic() + (engine.timeout if timeout is None else timeout)
        if may_use_slots and neighbors_in_slots(engine.on_host, engine.transport, seq,
                                                deadline):
            # On one host, small arrays go through the entry's slots (shm_neighbor.py).
            signature = ("neighbor_allreduce" + SLOTS_SIGNATURE
                         + ("" if plan.check_pattern else UNCHECKED))
            engine.execute(seq, signature, dtype, tuple(x.shape), timeout, peers,
                           lambda call: engine.on_host.neighbors(
                               call, adapter, flat, plan, scratch=scratch, out=out_flat),
                           neighbours=True)
            adapter.synchronize()
            return x if out is None else out
        # On one host, large arrays are read from the sources' memory instead of copied
        # (neighbor_direct.py); never for a partial round.
        direct = neighbors_read_directly(engine.on_host, engine.transport, seq, deadline, plan,
                                         adapter=adapter, dtype=dtype, nbytes=nbytes)
        signature = ("neighbor_allreduce" + (DIRECT_SIGNATURE if direct else "")
                     + ("" if plan.check_pattern else UNCHECKED))
        # Push-sum scales a copy per destination every round: those buffers come from a
        # pool (an operation running concurrently gets its own), so rounds allocate none.
        key = (adapter.kind, dtype, adapter.size(flat), len(plan.dst_ranks))
        pooled = plan.dst_weights is not None and not direct
        buffers = engine.take_buffers(key, adapter, flat) if pooled else None

        def exchange(call):
            if direct:
                return direct_exchange(call, adapter, flat, plan, scratch=scratch,
                                       reader=cma.Reader(), entry=engine.on_host.entry,
                                       out=out_flat)
            return neighbor_exchange(call, adapter, flat, plan, scratch=scratch,
                                     send_buffers=buffers, out=out_flat)
        try:
            missing = engine.execute(seq, signature, dtype, tuple(x.shape), timeout, peers,
                                     exchange, neighbours=True)
        finally:
            if buffers is not None:
                engine.give_buffers(key, buffers)
        adapter.synchronize()
        if missing:
            # Raised after execute: the round completed, so no peer is told to abort;
            # the result is in place, a non-contiguous x's too.
            stage.finish()
            raise incomplete(engine.rank, seq, missing, plan.dst_ranks)
        return x if out is None else out
    return engine.launch(f"neighbor_allreduce seq {seq}", body, wait, stage)


def _compressed(engine: Engine, x: Any, plan: NeighborPlan, codec: Codec, *, out: Any,
                wait: bool, timeout: float | None, stats: CodecStats) -> Any:
    """The exchange of encodings (module docstring) in ``codec``, the plan's: into ``out`` if
    given, and then ``x`` is left holding D(E(x)), the value its neighbours received."""
    adapter, flat, dtype = flat_of(x)
    plan.check(engine.rank, engine.world_size, dtype)
    out_flat = None
    if out is not None and out is not x:
        out_flat = engine.out_like(adapter, dtype, adapter.size(flat), out,
                                   "neighbor_allreduce", "like x")
    x32 = as_float32(adapter, flat, dtype)
    accumulate = "float64" if dtype == "float64" else "float32"   # the sum, not the wire
    seq = engine.next_seq()
    signature = f"neighbor_allreduce({codec.name})" + ("" if plan.check_pattern else UNCHECKED)

    def body() -> Any:
        result = engine.execute(
            seq, signature, wire_dtype(codec), (x32.size,), timeout, plan.peers,
            lambda call: compressed_exchange(call, x32, plan, stats, accumulate),
            neighbours=True)
        if out_flat is not None:
            write_back(adapter, flat, x32)       # x: what the neighbours received of it
            write_back(adapter, out_flat, result)
        else:
            write_back(adapter, flat, result)
        adapter.synchronize()
        return x if out_flat is None else out
    return engine.launch(f"neighbor_allreduce({codec.name}) seq {seq}", body, wait)
