"""The communicator: every collective and point-to-point call of one peer, sequenced so that
peers' calls meet in the same mailbox, with blocking and non-blocking twins.

Each collective call takes the next sequence number *in the calling thread*, so peers that call
the same operations in the same order agree on mailboxes even when the operations run
concurrently. ``wait=False`` queues the operation on the communicator's worker thread and
returns a Work handle; a blocking call runs in the caller's thread. A barrier also waits for
this peer's earlier operations (not raising their errors: their Works do), so it implies they
finished everywhere.

When an operation fails on one peer (a lost peer, a mismatched call), that peer tells the others
in the operation (ABORT), so they raise at once instead of waiting out their timeout.
Point-to-point send/recv run on the communicator's second channel (operations/send_recv.py).

The class is whole here; what every call does around its data movement (sequence numbers,
the operation's life, the worker thread, the send-buffer pool) is a component with a public
interface, the Engine (engine.py), which the Communicator owns and hands to the calls that
have a module of their own (the neighbour exchange, the rooted calls, the compressed and
coalesced allreduces, the neighbour allgather). So those modules, like this one, use only
the engine's public methods, never the Communicator's private state.
"""
from __future__ import annotations

import functools
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Callable, Literal, TypeVar, overload

import numpy as np

from collectives import defaults
from collectives.algorithms import choice
from collectives.algorithms.allgather import ring_allgather_into
from collectives.algorithms.broadcast import pipelined_broadcast
from collectives.algorithms.compressed import CodecStats
from collectives.algorithms.p2p import Call, wait_sent
from collectives.algorithms.shm_copies import CallArrays, SlotArrays
from collectives.algorithms.shm_entry import crowded
from collectives.algorithms.ring import (counts_digest, ring_reduce_scatter, segments,
                                         segments_of_counts)
from collectives.arrays.adapter import ArrayAdapter, check_reduce_op
from collectives.arrays.interface import Array
from collectives.codecs.catalog import CodecSpec, parse
from collectives.engine import Engine
from collectives.errors import OperationTimeout, UnsupportedDtype
from collectives.neighbor_plan import NeighborPlan
from collectives.operations import rooted
from collectives.operations.allgatherv import allgather_variable
from collectives.operations.coalesced import coalesced_allreduce
from collectives.operations.compressed_allreduce import compressed_allreduce
from collectives.operations.neighbor_allgather import neighbor_allgather
from collectives.operations.link_rates import LinkRates, measure_links
from collectives.operations.neighbor_allreduce import neighbor_allreduce
from collectives.operations.scan import scan
from collectives.operations.send_recv import PointToPoint, SendRequest, Status
from collectives.staging import Staging
from collectives.transport.transport import Transport
from collectives.transport.wire import Channel, dtype_itemsize
from collectives.work import Work

if TYPE_CHECKING:
    from collectives.algorithms.nccl import NcclGroup   # imported on the first device array

__all__ = ["Communicator", "COLLECTIVE_CHANNEL", "P2P_CHANNEL", "DEFAULT_SMALL_BYTES"]

log = logging.getLogger("collectives")

# The main communicator's channels (public names; the registry is transport/wire.py's Channel).
COLLECTIVE_CHANNEL = Channel.COLLECTIVE
"""The channel of a peer's main communicator's collectives (transport/wire.py's Channel)."""
P2P_CHANNEL = Channel.P2P
"""The channel of a peer's main communicator's point-to-point send and recv."""
# Below this many bytes allreduce uses recursive doubling (latency-bound); above, the ring
# (bandwidth-bound). Chosen by measurement: see benchmarks/allreduce_threshold.py.
DEFAULT_SMALL_BYTES = 256 * 1024


_Method = TypeVar("_Method", bound=Callable[..., Any])


def _named(operation: str) -> Callable[[_Method], _Method]:
    """A public call of the communicator: an array of a dtype the wire does not carry is
    refused (staging.flat_of, before a sequence number is taken) naming this peer's rank and
    ``operation``."""
    def decorate(method: _Method) -> _Method:
        @functools.wraps(method)
        def call(self: "Communicator", *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, *args, **kwargs)
            except UnsupportedDtype as exc:
                if exc.operation is not None:
                    raise
                raise exc.named(self.rank, operation) from None
        return call  # type: ignore[return-value]
    return decorate


class Communicator:
    """One stream of collective operations (and its point-to-point twin) over a Transport."""

    def __init__(self, transport: Transport, *, channel: int = COLLECTIVE_CHANNEL) -> None:
        self.transport = transport
        self.rank = transport.rank
        self.world_size = transport.world_size
        if channel % 2:
            raise ValueError(f"channel {channel} is odd; communicators take even channels")
        # A pair (wire.Channel): sequence numbers of two communicators never interleave.
        self.channel = int(channel)  # a plain int: it is part of every mailbox key
        self.p2p_channel = channel + Channel.P2P - Channel.COLLECTIVE
        self._p2p = PointToPoint(transport, self.p2p_channel)
        self._nccl: NcclGroup | None = None  # made on the first device array
        self.codec_stats = CodecStats()  # what the compressed calls encoded and refused
        self._on_host = choice.OnHost(self.rank)   # its shared-memory allreduces' arenas
        #: What every call runs through: sequence numbers, the operation's life, the worker
        #: thread (engine.py).
        self.engine = Engine(transport, self.channel, self._on_host)
        #: The order of the peers in the cross-host rings of allreduce (use_ring), or None:
        #: rank order.
        self._ring: list[int] | None = None

    @property
    def timeout(self) -> float:
        """The transport's timeout in seconds, for calls given none."""
        return self.transport.config.timeout

    def _nccl_for(self, adapter: ArrayAdapter, x: Array, op: str | None,
                  dtype: str) -> NcclGroup | None:
        """The NCCL group when device arrays go through NCCL, i.e. when every peer can
        (decided collectively, once); None otherwise."""
        if adapter.on_host or self.world_size == 1:
            return None
        if self._nccl is None:
            from collectives.algorithms.nccl import NcclGroup
            self._nccl = NcclGroup(self)
        device = x.device.index if hasattr(x, "data_ptr") else x.device.id
        if self._nccl.decide(int(device), self.transport.endpoints["host"]) and \
                self._nccl.supports(op, dtype):
            return self._nccl
        return None

    # ------------------------------------------------------------------ collectives
    # Each call with ``wait`` returns its result, or with wait=False a Work whose result it
    # is: the overloads say which to a type checker.
    @overload
    def allreduce(self, x: Array, op: str = "sum", *, wait: Literal[True] = True,
                  timeout: float | None = None, algorithm: str = "auto",
                  compression: CodecSpec = None, residual: Array | None = None,
                  _layout: str = "") -> Array: ...

    @overload
    def allreduce(self, x: Array, op: str = "sum", *, wait: Literal[False],
                  timeout: float | None = None, algorithm: str = "auto",
                  compression: CodecSpec = None, residual: Array | None = None,
                  _layout: str = "") -> Work: ...

    @overload
    def allreduce(self, x: Array, op: str = "sum", *, wait: bool = True,
                  timeout: float | None = None, algorithm: str = "auto",
                  compression: CodecSpec = None, residual: Array | None = None,
                  _layout: str = "") -> Array | Work: ...

    @_named("allreduce")
    def allreduce(self, x: Array, op: str = "sum", *, wait: bool = True,
                  timeout: float | None = None, algorithm: str = "auto",
                  compression: CodecSpec = None, residual: Array | None = None,
                  _layout: str = "") -> Array | Work:
        """Reduce ``x`` (or a list of arrays in one call: operations/coalesced.py) across all
        peers in place; returns it (or a Work). Every peer passes the same shape, dtype and op.
        ``algorithm``: "auto" or one of choice.ALLREDUCE_ALGORITHMS ("shm", "shm-small":
        every peer on this host; "hierarchical": hosts in two levels; choice.py says which
        "auto" takes); ``compression``, ``residual``: operations/compressed_allreduce.py."""
        codec = parse(compression)
        if isinstance(x, (list, tuple)):
            if residual is not None:
                raise ValueError(f"rank {self.rank}: allreduce of a list of arrays takes no "
                                 "residual (error feedback is per array: one call each)")
            return coalesced_allreduce(self.engine, self.allreduce, x, op, wait=wait,
                                       timeout=timeout, algorithm=algorithm,
                                       compression=codec)
        if codec is not None:
            return compressed_allreduce(self.engine, x, op, codec, wait=wait,
                                        timeout=timeout, stats=self.codec_stats,
                                        residual=residual, small_bytes=DEFAULT_SMALL_BYTES,
                                        layout=_layout)
        stage = Staging()
        adapter, flat, dtype = stage.flat(x)
        check_reduce_op(op, dtype)
        nccl = self._nccl_for(adapter, x, op, dtype)
        if nccl is not None:
            nccl.allreduce(flat, adapter.size(flat), dtype, op)
            if op == "mean":
                adapter.divide(flat, self.world_size)
            return self.engine.done(x, f"allreduce({op},nccl)", wait, stage)
        nbytes = adapter.size(flat) * dtype_itemsize(dtype)
        algorithm, algo = choice.allreduce_algorithm(algorithm, dtype, nbytes, DEFAULT_SMALL_BYTES,
                                              self._on_host, self.transport, adapter)
        seq = self.engine.next_seq(algorithm)
        ring = self._ring if algorithm in choice.RING_ORDERED else None
        # The ring is part of the signature: peers that order it differently get a
        # ProtocolError on every peer, never a sum of the wrong segments.
        signature = (f"allreduce({op},{algorithm}{_layout}"    # _layout: coalesced's
                     + ("" if ring is None else f",ring={counts_digest(ring)}") + ")")

        def run(call: Call) -> None:
            if ring is None:
                algo(call, adapter, flat, op)
            else:
                algo(call, adapter, flat, op, ring=ring)

        def body() -> Array:
            if self.world_size > 1:
                self.engine.execute(seq, signature, dtype, tuple(x.shape), timeout,
                                    self.engine.peers, run)
            adapter.synchronize()
            return x
        return self.engine.launch(f"{signature} seq {seq}", body, wait, stage)

    @overload
    def reduce_scatter(self, x: Array, op: str = "sum", *, counts: Sequence[int] | None = None,
                       wait: Literal[True] = True, timeout: float | None = None) -> Array: ...

    @overload
    def reduce_scatter(self, x: Array, op: str = "sum", *, counts: Sequence[int] | None = None,
                       wait: Literal[False], timeout: float | None = None) -> Work: ...

    @overload
    def reduce_scatter(self, x: Array, op: str = "sum", *, counts: Sequence[int] | None = None,
                       wait: bool = True, timeout: float | None = None) -> Array | Work: ...

    @_named("reduce_scatter")
    def reduce_scatter(self, x: Array, op: str = "sum", *, counts: Sequence[int] | None = None,
                       wait: bool = True, timeout: float | None = None) -> Array | Work:
        """Reduce ``x`` across peers; this peer gets its segment, returned as a view into
        ``x``: rank r's is elements [N*r//n, N*(r+1)//n) of the flattened array, or with
        ``counts`` (MPI's Reduce_scatter recvcounts, one per peer, adding up to N) the
        ``counts[r]`` elements after the first r segments. Peers must pass the same counts
        (they are part of the call's signature: ProtocolError on every peer if not). A
        non-contiguous ``x`` is left as it was; the segment is a view into a copy of it."""
        adapter, flat, dtype = Staging().flat(x, written=False)
        check_reduce_op(op, dtype)
        n, r = self.world_size, self.rank
        size = adapter.size(flat)
        if counts is None:
            segs = segments(size, n)
            signature = f"reduce_scatter({op})"
        else:
            try:   # (against this peer's own x: the others cannot see it)
                segs = segments_of_counts(counts, size, n, r, "reduce_scatter")
            except ValueError as exc:
                self.engine.refuse(exc, f"reduce_scatter({op})")
            signature = f"reduce_scatter({op},counts={counts_digest([b - a for a, b in segs])})"
        copies = choice.on_host_copies(self._on_host, self.transport, adapter, dtype,
                                       size * dtype_itemsize(dtype))
        seq = self.engine.next_seq("shm" if copies else "")
        signature += choice.COPIES_SIGNATURE if copies else ""
        shifted = segs[-1:] + segs[:-1]   # the ring leaves peer r with segment r + 1
        reduce_op = "sum" if op == "mean" else op

        # A call that fails leaves each element of x as it was or at its result: the ring
        # makes the partial sums it forwards aside, and on one host each block of this
        # peer's segment is reduced aside and written whole.
        def ring(call: Call) -> None:
            wait_sent(call, ring_reduce_scatter(call, adapter, flat, reduce_op, segs=shifted,
                                                divide_by=n if op == "mean" else 0,
                                                aside=True))

        def move(peers: CallArrays) -> None:
            lo, hi = segs[r]   # this peer's segment, reduced in place (the others read theirs)
            peers.reduce(reduce_op, flat, lo, lo, hi, [j for j in range(n) if j != r],
                         divide_by=n if op == "mean" else 0)

        def body() -> Array:
            if n > 1:
                def run(call: Call) -> None:
                    if copies is None:
                        return ring(call)
                    copies(call, adapter, flat, move, lambda: ring(call),
                           slot_bytes=size * dtype_itemsize(dtype))
                self.engine.execute(seq, signature, dtype, tuple(x.shape), timeout,
                                    self.engine.peers, run)
            lo, hi = segs[r]
            adapter.synchronize()
            return adapter.slice(flat, lo, hi)
        return self.engine.launch(f"{signature} seq {seq}", body, wait)

    @overload
    def allgather(self, x: Array, *, out: Array | None = None, variable: Literal[False] = False,
                  wait: Literal[True] = True, timeout: float | None = None) -> Array: ...

    @overload
    def allgather(self, x: Array, *, out: Array | None = None, variable: Literal[True],
                  wait: Literal[True] = True, timeout: float | None = None) -> list[Array]: ...

    @overload
    def allgather(self, x: Array, *, out: Array | None = None, variable: bool = False,
                  wait: Literal[False], timeout: float | None = None) -> Work: ...

    @overload
    def allgather(self, x: Array, *, out: Array | None = None, variable: bool = False,
                  wait: bool = True, timeout: float | None = None
                  ) -> Array | list[Array] | Work: ...

    @_named("allgather")
    def allgather(self, x: Array, *, out: Array | None = None, variable: bool = False,
                  wait: bool = True, timeout: float | None = None
                  ) -> Array | list[Array] | Work:
        """Gather every peer's ``x``. Equal sizes: an array of shape (n, *x.shape) (into
        ``out`` if given). ``variable=True`` (MPI's Allgatherv): sizes may differ; returns a
        list of n flat arrays, views into one buffer: ``out`` if given (of the sum of the
        peers' sizes; one that is not is a ProtocolError on every peer, before any data
        moves; contiguous or one-dimensional, else a ValueError, the call refused on every
        peer), else a new one."""
        if variable:
            return allgather_variable(self.engine, x, out, wait, timeout)
        stage = Staging()
        adapter, flat, dtype = stage.flat(x, written=False)
        n = self.world_size
        count = adapter.size(flat)
        nccl = None if out is not None else self._nccl_for(adapter, x, None, dtype)
        if nccl is not None:
            gathered = adapter.empty(n * count, dtype, flat)
            nccl.allgather(flat, gathered, count, dtype)
            return self.engine.done(gathered.reshape((n,) + tuple(x.shape)), "allgather(nccl)",
                                    wait)
        # A refused out= fails a call of its own on every peer (Engine.refuse).
        if out is None:
            out = adapter.empty(n * count, dtype, flat)
            out = out.reshape((n,) + tuple(x.shape))
            out_flat = adapter.flat(out)
        else:
            out_flat = self.engine.out_like(adapter, dtype, n * count, out, "allgather",
                                            f"{count} elements from {n} peers", stage)
        copies = choice.on_host_copies(self._on_host, self.transport, adapter, dtype,
                                       count * dtype_itemsize(dtype))
        seq = self.engine.next_seq("shm" if copies else "")
        signature = "allgather" + (choice.COPIES_SIGNATURE if copies else "")

        def run(call: Call) -> Array:
            if copies is None:
                ring_allgather_into(call, adapter, flat, out_flat, segments(n * count, n))
                return out

            def move(peers: CallArrays) -> None:
                for j in range(n):
                    if j != self.rank:
                        peers.copy(j, 0, out_flat, j * count, (j + 1) * count)
                r = self.rank
                adapter.copy(adapter.slice(out_flat, r * count, (r + 1) * count), flat)
            copies(call, adapter, flat, move, lambda: ring_allgather_into(
                call, adapter, flat, out_flat, segments(n * count, n)),
                slot_bytes=count * dtype_itemsize(dtype))
            return out

        def body() -> Array:
            if n == 1:
                result = run(self.engine.call(seq, signature, dtype, tuple(x.shape),
                                              time.monotonic() + self.timeout))
            else:
                result = self.engine.execute(seq, signature, dtype, (n * count,), timeout,
                                             self.engine.peers, run)
            adapter.synchronize()
            return result
        return self.engine.launch(f"{signature} seq {seq}", body, wait, stage)

    @overload
    def broadcast(self, x: Array, root: int = 0, *, wait: Literal[True] = True,
                  timeout: float | None = None) -> Array: ...

    @overload
    def broadcast(self, x: Array, root: int = 0, *, wait: Literal[False],
                  timeout: float | None = None) -> Work: ...

    @overload
    def broadcast(self, x: Array, root: int = 0, *, wait: bool = True,
                  timeout: float | None = None) -> Array | Work: ...

    @_named("broadcast")
    def broadcast(self, x: Array, root: int = 0, *, wait: bool = True,
                  timeout: float | None = None) -> Array | Work:
        """Copy root's ``x`` into every peer's ``x`` (in place) and return it."""
        if not 0 <= root < self.world_size:
            raise ValueError(f"root {root} is outside world size {self.world_size}")
        stage = Staging()
        adapter, flat, dtype = stage.flat(x)
        nccl = self._nccl_for(adapter, x, None, dtype)
        if nccl is not None:
            nccl.broadcast(flat, adapter.size(flat), dtype, root)
            return self.engine.done(x, f"broadcast(root={root},nccl)", wait, stage)
        count = adapter.size(flat)
        copies = choice.on_host_copies(self._on_host, self.transport, adapter, dtype,
                                       count * dtype_itemsize(dtype))
        seq = self.engine.next_seq("shm" if copies else "")
        signature = f"broadcast(root={root})" + (choice.COPIES_SIGNATURE if copies else "")
        mine = self.rank == root

        # Read straight from the root's array, each peer reads all but the first count // n
        # elements, which the root (idle otherwise) writes into every peer's array meanwhile:
        # n processes copy instead of n - 1 (4 MiB, 2 peers on 2 cores: 0.33 ms against
        # 0.52); not where the peers outnumber the root's CPUs (the readers keep them busy).
        # The root's share is its to decide: it announces it.
        share = 0 if crowded(self.world_size) else count // self.world_size

        def move(peers: CallArrays) -> None:
            if isinstance(peers, SlotArrays):
                if not mine:
                    peers.copy(root, 0, flat, 0, count)
            elif mine:
                for j in range(self.world_size):
                    if j != root:
                        peers.put(j, 0, flat, 0, share)
            else:
                written = peers.notes[root]
                peers.copy(root, written, flat, written, count)

        def run(call: Call) -> None:
            if copies is None:
                return pipelined_broadcast(call, adapter, flat, root)
            copies(call, adapter, flat if mine else None, move,
                   lambda: pipelined_broadcast(call, adapter, flat, root),
                   # (the root's array is read by all; it writes into theirs)
                   readers=None if mine else (root,), target=None if mine else flat,
                   note=share, slot_bytes=count * dtype_itemsize(dtype))

        def body() -> Array:
            if self.world_size > 1:
                self.engine.execute(seq, signature, dtype, tuple(x.shape), timeout,
                                    self.engine.peers, run)
            adapter.synchronize()
            return x
        return self.engine.launch(f"{signature} seq {seq}", body, wait, stage)

    @overload
    def reduce(self, x: Array, root: int = 0, op: str = "sum", *, wait: Literal[True] = True,
               timeout: float | None = None) -> Array: ...

    @overload
    def reduce(self, x: Array, root: int = 0, op: str = "sum", *, wait: Literal[False],
               timeout: float | None = None) -> Work: ...

    @overload
    def reduce(self, x: Array, root: int = 0, op: str = "sum", *, wait: bool = True,
               timeout: float | None = None) -> Array | Work: ...

    @_named("reduce")
    def reduce(self, x: Array, root: int = 0, op: str = "sum", *, wait: bool = True,
               timeout: float | None = None) -> Array | Work:
        """Reduce every peer's ``x`` into the root's, in place (rooted.reduce)."""
        return rooted.reduce(self.engine, x, root, op, wait, timeout)

    @overload
    def gather(self, x: Array, root: int = 0, *, out: Array | None = None,
               counts: Sequence[int] | None = None,
               wait: Literal[True] = True, timeout: float | None = None) -> Array | None: ...

    @overload
    def gather(self, x: Array, root: int = 0, *, out: Array | None = None,
               counts: Sequence[int] | None = None,
               wait: Literal[False], timeout: float | None = None) -> Work: ...

    @overload
    def gather(self, x: Array, root: int = 0, *, out: Array | None = None,
               counts: Sequence[int] | None = None,
               wait: bool = True, timeout: float | None = None) -> Array | None | Work: ...

    @_named("gather")
    def gather(self, x: Array, root: int = 0, *, out: Array | None = None,
               counts: Sequence[int] | None = None, wait: bool = True,
               timeout: float | None = None) -> Array | None | Work:
        """Every peer's ``x`` at the root, shape (n, *x.shape); None elsewhere. ``counts``
        (MPI's Gatherv): peer j sends ``counts[j]`` elements, the root gets them in one flat
        array, in rank order (rooted.gather)."""
        return rooted.gather(self.engine, x, root, out, wait, timeout, counts)

    @overload
    def scatter(self, x: Array, root: int = 0, *, out: Array | None = None,
                counts: Sequence[int] | None = None,
                wait: Literal[True] = True, timeout: float | None = None) -> Array: ...

    @overload
    def scatter(self, x: Array, root: int = 0, *, out: Array | None = None,
                counts: Sequence[int] | None = None,
                wait: Literal[False], timeout: float | None = None) -> Work: ...

    @overload
    def scatter(self, x: Array, root: int = 0, *, out: Array | None = None,
                counts: Sequence[int] | None = None,
                wait: bool = True, timeout: float | None = None) -> Array | Work: ...

    @_named("scatter")
    def scatter(self, x: Array, root: int = 0, *, out: Array | None = None,
                counts: Sequence[int] | None = None, wait: bool = True,
                timeout: float | None = None) -> Array | Work:
        """Part r of the root's ``x`` into peer r's ``out``. ``counts`` (MPI's Scatterv):
        part j is the next ``counts[j]`` elements of the root's flat ``x`` (rooted.scatter)."""
        return rooted.scatter(self.engine, x, root, out, wait, timeout, counts)

    @overload
    def alltoall(self, x: Array, *, out: Array | None = None,
                 send_counts: Sequence[int] | None = None,
                 recv_counts: Sequence[int] | None = None, wait: Literal[True] = True,
                 timeout: float | None = None) -> Array: ...

    @overload
    def alltoall(self, x: Array, *, out: Array | None = None,
                 send_counts: Sequence[int] | None = None,
                 recv_counts: Sequence[int] | None = None, wait: Literal[False],
                 timeout: float | None = None) -> Work: ...

    @overload
    def alltoall(self, x: Array, *, out: Array | None = None,
                 send_counts: Sequence[int] | None = None,
                 recv_counts: Sequence[int] | None = None, wait: bool = True,
                 timeout: float | None = None) -> Array | Work: ...

    @_named("alltoall")
    def alltoall(self, x: Array, *, out: Array | None = None,
                 send_counts: Sequence[int] | None = None,
                 recv_counts: Sequence[int] | None = None, wait: bool = True,
                 timeout: float | None = None) -> Array | Work:
        """Block j of ``x`` to peer j; block r of every peer's in ``out``; equal blocks, or
        ``send_counts``/``recv_counts`` elements per peer (rooted.alltoall)."""
        return rooted.alltoall(self.engine, x, out, wait, timeout, send_counts, recv_counts)

    @overload
    def scan(self, x: Array, op: str = "sum", *, exclusive: bool = False,
             wait: Literal[True] = True, timeout: float | None = None) -> Array: ...

    @overload
    def scan(self, x: Array, op: str = "sum", *, exclusive: bool = False,
             wait: Literal[False], timeout: float | None = None) -> Work: ...

    @overload
    def scan(self, x: Array, op: str = "sum", *, exclusive: bool = False, wait: bool = True,
             timeout: float | None = None) -> Array | Work: ...

    @_named("scan")
    def scan(self, x: Array, op: str = "sum", *, exclusive: bool = False, wait: bool = True,
             timeout: float | None = None) -> Array | Work:
        """Peers 0..r's ``x`` reduced into peer r's, in place (MPI_Scan); ``exclusive``:
        peers 0..r-1's (MPI_Exscan; rank 0's ``x`` the op's identity) (operations/scan.py)."""
        return scan(self.engine, x, op, exclusive, wait, timeout)

    @overload
    def neighbor_exchange(self, x: Array, plan: NeighborPlan, *, scratch: Array | None = None,
                          out: Array | None = None, wait: Literal[True] = True,
                          timeout: float | None = None) -> Array: ...

    @overload
    def neighbor_exchange(self, x: Array, plan: NeighborPlan, *, scratch: Array | None = None,
                          out: Array | None = None, wait: Literal[False],
                          timeout: float | None = None) -> Work: ...

    @overload
    def neighbor_exchange(self, x: Array, plan: NeighborPlan, *, scratch: Array | None = None,
                          out: Array | None = None, wait: bool = True,
                          timeout: float | None = None) -> Array | Work: ...

    @_named("neighbor_exchange")
    def neighbor_exchange(self, x: Array, plan: NeighborPlan, *, scratch: Array | None = None,
                          out: Array | None = None, wait: bool = True,
                          timeout: float | None = None) -> Array | Work:
        """One round of the neighbour exchange ``plan`` on ``x``: x <- plan.self_weight * x +
        sum_j plan.src_weights[j] * x_j, sending x to ``plan.dst_ranks`` (each scaled by
        ``plan.dst_weights[dst]`` if given). In place; returns x. With ``out`` (an array of
        x's size and dtype) the result goes there instead, x is only sent and stays as it was,
        and out is returned; ``scratch``: a buffer like x for what arrives (else allocated
        each round). A round that fails may leave x combined in part (on one host, large
        arrays are combined in place block by block: algorithms/neighbor_direct.py); with
        ``out`` x is never written.

        Only the peers named take part, so a pattern may be directed or change every round;
        peers must agree on it (j in my src_weights iff I am in j's dst_ranks). With
        ``plan.check_pattern`` (the default) that is checked before the data is combined: a
        pattern that does not pair is a ValueError on the peers involved, naming both ranks,
        instead of a wait for the timeout (algorithms/pattern.py). The plan rides in the
        data's header, so on a ring it costs nothing measurable; on a directed pattern a peer
        also waits for its destinations to begin, and peers it only hears from get one tiny
        message more. Without the check, every peer of the exchange must skip it too (a peer
        that checks meets a call of another signature: ProtocolError).

        ``plan.partial``: a peer lost (or silent past the timeout) during the round is left
        out instead of failing it: the round completes over the others (with
        ``dst_weights``, a missing destination's share stays in ``self_weight``), nothing is
        aborted, and ExchangeIncomplete (a PeerLost) is raised afterwards naming the missing
        ranks, with the result in place (see algorithms/neighbor.py).

        ``plan.compression``: the encodings travel instead (operations/neighbor_allreduce.py)."""
        return neighbor_allreduce(self.engine, x, plan, scratch=scratch, out=out, wait=wait,
                                  timeout=timeout, stats=self.codec_stats)

    @overload
    def neighbor_allreduce(self, x: Array, self_weight: float, src_weights: Mapping[int, float],
                           dst_ranks: Iterable[int], *,
                           dst_weights: Mapping[int, float] | None = None,
                           scratch: Array | None = None, out: Array | None = None,
                           wait: Literal[True] = True, timeout: float | None = None,
                           partial: bool = False, check_pattern: bool = True,
                           compression: CodecSpec = None) -> Array: ...

    @overload
    def neighbor_allreduce(self, x: Array, self_weight: float, src_weights: Mapping[int, float],
                           dst_ranks: Iterable[int], *,
                           dst_weights: Mapping[int, float] | None = None,
                           scratch: Array | None = None, out: Array | None = None,
                           wait: Literal[False], timeout: float | None = None,
                           partial: bool = False, check_pattern: bool = True,
                           compression: CodecSpec = None) -> Work: ...

    @overload
    def neighbor_allreduce(self, x: Array, self_weight: float, src_weights: Mapping[int, float],
                           dst_ranks: Iterable[int], *,
                           dst_weights: Mapping[int, float] | None = None,
                           scratch: Array | None = None, out: Array | None = None,
                           wait: bool = True, timeout: float | None = None,
                           partial: bool = False, check_pattern: bool = True,
                           compression: CodecSpec = None) -> Array | Work: ...

    @_named("neighbor_allreduce")
    def neighbor_allreduce(self, x: Array, self_weight: float, src_weights: Mapping[int, float],
                           dst_ranks: Iterable[int], *,
                           dst_weights: Mapping[int, float] | None = None,
                           scratch: Array | None = None, out: Array | None = None,
                           wait: bool = True, timeout: float | None = None,
                           partial: bool = False, check_pattern: bool = True,
                           compression: CodecSpec = None) -> Array | Work:
        """x <- self_weight * x + sum_j src_weights[j] * x_j, sending x to ``dst_ranks``:
        neighbor_exchange with the NeighborPlan of these arguments (see there)."""
        plan = NeighborPlan.of_call(self.rank, self_weight, src_weights, dst_ranks,
                                    dst_weights=dst_weights, partial=partial,
                                    check_pattern=check_pattern, compression=compression)
        return self.neighbor_exchange(x, plan, scratch=scratch, out=out, wait=wait,
                                      timeout=timeout)

    @overload
    def neighbor_allgather(self, x: Array, src_ranks: Iterable[int], dst_ranks: Iterable[int],
                           *, wait: Literal[True] = True,
                           timeout: float | None = None) -> Array: ...

    @overload
    def neighbor_allgather(self, x: Array, src_ranks: Iterable[int], dst_ranks: Iterable[int],
                           *, wait: Literal[False], timeout: float | None = None) -> Work: ...

    @overload
    def neighbor_allgather(self, x: Array, src_ranks: Iterable[int], dst_ranks: Iterable[int],
                           *, wait: bool = True, timeout: float | None = None) -> Array | Work: ...

    @_named("neighbor_allgather")
    def neighbor_allgather(self, x: Array, src_ranks: Iterable[int], dst_ranks: Iterable[int],
                           *, wait: bool = True, timeout: float | None = None) -> Array | Work:
        """``x`` to ``dst_ranks``; the ``src_ranks``' arrays concatenated along the first
        axis, in the order ``src_ranks`` names them (BlueFog's; operations/neighbor_allgather.py)."""
        return neighbor_allgather(self.engine, x, src_ranks, dst_ranks, wait, timeout)

    def barrier(self, timeout: float | None = None, *, wait: bool = True) -> Work | None:
        """Return once every peer has entered the barrier, and this peer's earlier
        non-blocking operations have finished (whatever their outcome: an error of theirs is
        their Work's to raise, not the barrier's). ``wait=False`` (MPI's Ibarrier): a Work at
        once, done once the barrier is, run after the earlier non-blocking operations.
        OperationTimeout, on every peer, if an earlier operation of this peer or a peer's
        arrival takes past ``timeout``."""
        name, algo = choice.barrier_algorithm(self._on_host, self.transport)
        # (wait=False: the worker thread runs the barrier after them anyway)
        last = self.engine.last() if wait else None
        seq = self.engine.next_seq(name)
        limit = self.timeout if timeout is None else timeout

        def finished(deadline: float) -> None:
            # The barrier's number is taken: a wait that runs out fails the barrier (on every
            # peer, as any of its failures), never leaves this peer a number behind.
            if last is not None and not last.join(max(0.0, deadline - time.monotonic())):
                raise OperationTimeout(f"rank {self.rank}: barrier: this peer's earlier "
                                       f"{last.description} did not finish within {limit:g}s")

        def run(call: Call) -> None:
            finished(call.deadline)
            algo(call)

        def body() -> None:
            if self.world_size > 1:
                self.engine.execute(seq, f"barrier({name})", "uint8", choice.BARRIER_SHAPE,
                                    timeout, self.engine.peers, run)
            else:
                finished(time.monotonic() + limit)
        return self.engine.launch(f"barrier({name}) seq {seq}", body, wait)

    # ------------------------------------------------------------------ the ring's order
    def measure_links(self, nbytes: int = 4 << 20, *, repeats: int = 2,
                      timeout: float | None = None,
                      among: Sequence[int] | None = None) -> LinkRates:
        """Measure what every directed link between the peers carries (a collective call:
        every peer calls it with the same arguments): each pair of peers times ``nbytes``
        each way, the best of ``repeats``, in rounds where no peer is in two pairs
        (operations/link_rates.py); ``among``: only the pairs of these ranks (one peer a host,
        say), the others take part in the call and measure nothing. Every peer gets the same
        LinkRates, whose ``ring()`` is the order of the measured ranks that makes the ring's
        slowest link fastest."""
        try:
            members = None if among is None else [int(j) for j in among]
        except (TypeError, ValueError):
            raise ValueError(f"rank {self.rank}: measure_links among {among!r}: ranks of the "
                             f"{self.world_size} peers, each once") from None
        if self.world_size == 1:
            return LinkRates(((0.0,),), nbytes, repeats)
        row = measure_links(self.engine, nbytes, repeats, timeout, members)
        rows = self.allgather(np.asarray(row, dtype=np.float64), timeout=timeout)
        matrix = np.asarray(rows).reshape(self.world_size, self.world_size)
        return LinkRates(tuple(tuple(float(v) for v in line) for line in matrix), nbytes,
                         repeats, tuple(range(self.world_size)) if members is None
                         else tuple(members))

    @property
    def ring(self) -> list[int] | None:
        """The ring order the ring and hierarchical allreduces use (use_ring), or None: the
        rank order."""
        return None if self._ring is None else list(self._ring)

    def use_ring(self, ring: Sequence[int] | None) -> None:
        """Order the peers of the ring allreduce (``algorithm="ring"``, which "auto" takes
        across hosts with one peer a host) and of the hierarchical one's rings across hosts
        (hosts in the order their first peer comes in ``ring``) as ``ring``: every rank once,
        such as ``measure_links().ring()``; None goes back to the rank order. Every peer must
        set the same order before its next allreduce: the order is part of the call's
        signature, so peers that differ get a ProtocolError on every peer. Not collective
        itself (nothing is sent)."""
        if ring is None:
            self._ring = None
            return
        try:
            order = [int(j) for j in ring]
        except (TypeError, ValueError):
            order = []
        if sorted(order) != list(range(self.world_size)):
            raise ValueError(f"rank {self.rank}: use_ring needs every rank of the "
                             f"{self.world_size} peers once, got {list(ring)!r}")
        self._ring = None if order == list(range(self.world_size)) else order

    # ------------------------------------------------------------------ point to point
    @_named("send")
    def send(self, dst: int, x: Array, *, tag: int = 0, timeout: float | None = None) -> None:
        """Send ``x`` to ``dst`` with ``tag``; returns when ``x`` may be modified again
        (PointToPoint.send)."""
        self._p2p.send(dst, x, tag=tag, timeout=timeout)

    @_named("isend")
    def isend(self, dst: int, x: Array, *, tag: int = 0,
              timeout: float | None = None) -> SendRequest:
        """send's non-blocking twin, a SendRequest (PointToPoint.isend)."""
        return self._p2p.isend(dst, x, tag=tag, timeout=timeout)

    @_named("recv")
    def recv(self, src: int, out: Array | None = None, *, tag: int | None = None,
             status: Status | None = None, timeout: float | None = None) -> Array:
        """Receive the next array ``src`` sent with ``tag`` (None: any tag; ``status``
        gets its source, tag, dtype and shape: PointToPoint.recv)."""
        return self._p2p.recv(src, out, tag=tag, status=status, timeout=timeout)

    def probe(self, src: int, *, tag: int | None = None, status: Status | None = None) -> bool:
        """True when recv(src, tag=tag) would return or raise at once
        (PointToPoint.probe)."""
        return self._p2p.probe(src, tag=tag, status=status)

    def wait_any(self, sources: Iterable[int], timeout: float | None = None, *,
                 tag: int | None = None) -> int | None:
        """The first of ``sources`` with a message (of ``tag``) waiting
        (PointToPoint.wait_any)."""
        return self._p2p.wait_any(sources, timeout, tag=tag)

    def close(self, timeout: float = defaults.CLOSE_TIMEOUT) -> None:
        """Stop the worker thread (queued operations get up to ``timeout`` seconds to finish) and
        destroy the NCCL communicator; the transport is its owner's to close."""
        self.engine.close(timeout)
        self._on_host.close()
        if self._nccl is not None:
            self._nccl.close()

