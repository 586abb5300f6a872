"""Peer: one process's place in the group. It owns the transport (sockets and I/O thread), the
communicator (sequenced collectives) and the topology, and is what ``gossip.init()`` returns."""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Callable, Literal, overload

from collectives import NeighborPlan, Status, Work, defaults
from collectives.arrays import Array
from collectives.codecs import CodecSpec
from collectives.algorithms.hierarchical import host_groups
from collectives.algorithms.ring_order import DEFAULT_MARGIN
from collectives.communicator import Communicator
from collectives.operations.send_recv import SendRequest
from collectives.notices import EVENTS_LOGGER
from collectives.group import Switch, View
from collectives.transport import channel_pair
from collectives.transport.transport import Transport
from gossip.membership import MembershipParticipant, PeerMembership
from gossip import stacks
from gossip.objects import allgather_object, broadcast_object
from gossip.status.reporter import StatusReporter
from gossip.policies.base.concurrency import REAL_CONCURRENCY, Concurrency
from gossip.policies.neighborhood import live_mixing_round, resize_topology
from gossip.settings import LaunchSettings
from gossip.tracked import StepTracked, TrackedState
from topologies import Topology

if TYPE_CHECKING:
    from gossip.metrics import MetricsService

__all__ = ["Peer"]

log = logging.getLogger("gossip")
events = logging.getLogger(EVENTS_LOGGER)


def _size(nbytes: int) -> str:
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= f:
            return f"{nbytes / f:g} {unit}"
    return f"{nbytes} B"


class Peer:
    """A member of the group. Every blocking call takes ``timeout`` (default: the peer's) and
    raises PeerLost / OperationTimeout / ProtocolError naming the rank, address and operation
    instead of hanging. Use as a context manager, or call close()."""

    def __init__(self, transport: Transport, topology: Topology, settings: LaunchSettings, *,
                 membership: PeerMembership | None = None, joined: Switch | None = None
                 ) -> None:
        self._transport = transport
        self._comm = Communicator(transport)
        self._channels: dict[int, Communicator] = {}
        self.topology = topology
        self.settings = settings
        self._closed = False
        # Objects whose state_dict() travels with the state a joiner takes (an
        # ElasticSampler's cursor): name -> object; and states received before their object
        # existed.
        self._tracked: dict[str, TrackedState] = {}
        self._pending_tracked: dict[str, Any] = {}
        # Traffic totals of the transports of earlier views (stats() adds them).
        self._earlier_totals = dict.fromkeys(
            ("bytes_sent", "bytes_received", "messages_sent", "messages_received", "dropped"), 0)
        # Policies attached to this peer (they register themselves): close() stops them first,
        # so no background thread of theirs outlives the sockets.
        self._policies: list[MembershipParticipant] = []
        self._policies_lock = threading.Lock()
        # The membership controller (gossip/membership/): the door, view changes, state
        # transfer; None for a bare Peer. A joiner's (``joined``: its admission) starts
        # receiving the running job's state now, while the model is built.
        self._membership = membership
        if membership is not None:
            membership.bind(self, joined)
            # What `gossip status` asks this peer (its door answers, in the door's thread).
            reporter = StatusReporter(self)
            membership.door.on_request("status", reporter.answer)
            membership.door.every_poll(reporter.sample)
            stacks.watch(self)   # its flight recorder is written on SIGUSR1 (gossip/stacks.py)
        # The metrics exporters (gossip/metrics/), when start_metrics() found them asked for.
        self._metrics: MetricsService | None = None

    # -- identity ---------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        """This peer's rank, 0 to world_size - 1."""
        return self._transport.rank

    @property
    def world_size(self) -> int:
        """Number of peers in the group."""
        return self._transport.world_size

    @property
    def local_rank(self) -> int:
        """This peer's rank among the peers of its machine (from the launcher)."""
        return self.settings.local_rank

    @property
    def job_id(self) -> str:
        """The job this peer belongs to ("" when unnamed; see gossip.settings)."""
        return self._transport.config.job_id

    @property
    def timeout(self) -> float:
        """Default seconds of every blocking call (``init(timeout=...)``)."""
        return self._transport.config.timeout

    @property
    def transport(self) -> Transport:
        """The transport: sockets, I/O thread, lost-peer detection."""
        return self._transport

    @property
    def concurrency(self) -> Concurrency:
        """The threads, locks and clock a background policy uses here: the standard
        library's (a simulated peer's are virtual: gossip/policies/base/concurrency.py)."""
        return REAL_CONCURRENCY

    @property
    def communicator(self) -> Communicator:
        """The peer's own communicator (channel 0), which the collectives below use."""
        return self._comm

    def channel(self, number: int) -> Communicator:
        """An independent communicator (same peers and sockets, its own sequence numbers):
        for a background thread whose operations must not interleave with the main thread's,
        e.g. an asynchronous policy. Every peer must use the same number for the same purpose;
        0 is the peer's own."""
        if number < 1:
            raise ValueError(f"channel {number}: use 1 or more (0 is the peer's own)")
        comm = self._channels.get(number)
        if comm is None:
            comm = self._channels[number] = Communicator(self._transport,
                                                         channel=channel_pair(number)[0])
        return comm

    def __repr__(self) -> str:
        return (f"Peer(rank={self.rank}, world_size={self.world_size}, "
                f"topology={self.topology!r}, endpoint={self._transport.endpoints['tcp']!r})")

    # -- point to point ---------------------------------------------------------------------
    def send(self, dst: int, array: Array, *, tag: int = 0,
             timeout: float | None = None) -> None:
        """Send ``array`` to rank ``dst`` with ``tag`` (an integer from 0, as MPI's and
        torch.distributed's); returns once the array may be modified again. Raises PeerLost
        if ``dst`` is gone, OperationTimeout past ``timeout``. ``dst`` may be this peer
        itself, as MPI allows: a copy waits for its ``recv``."""
        self._comm.send(dst, array, tag=tag, timeout=timeout)

    def isend(self, dst: int, array: Array, *, tag: int = 0,
              timeout: float | None = None) -> SendRequest:
        """send's non-blocking twin (MPI's Isend): the message is queued at once, in order,
        and the request's ``wait()`` returns once the array may be modified again (``test()``
        says whether it may, without waiting); both raise PeerLost if ``dst`` is gone."""
        return self._comm.isend(dst, array, tag=tag, timeout=timeout)

    def recv(self, src: int, out: Array | None = None, *, tag: int | None = None,
             status: Status | None = None, timeout: float | None = None) -> Array:
        """The next array rank ``src`` sent with ``tag`` (None, the default: whatever its
        tag, MPI's ANY_TAG), into ``out`` if given, which must match its dtype and size.
        Messages of other tags that came first stay receivable, in order. ``status`` (a
        ``gossip.Status``) gets the message's source, tag, dtype and shape. Raises PeerLost if
        ``src`` is gone with nothing queued, OperationTimeout past ``timeout``, ValueError
        for an ``out`` that does not fit (the message stays receivable)."""
        return self._comm.recv(src, out, tag=tag, status=status, timeout=timeout)

    def probe(self, src: int, *, tag: int | None = None, status: Status | None = None) -> bool:
        """True when a message from ``src`` (with ``tag``; None: any) is waiting
        (recv(src, tag=tag) would return at once); ``status`` then gets its source, tag,
        dtype and shape, without receiving it. A lost source with nothing queued gives False
        (and recv raises PeerLost): see lost_peers()."""
        return self._comm.probe(src, tag=tag, status=status)

    def wait_any(self, sources: Iterable[int], timeout: float | None = None, *,
                 tag: int | None = None) -> int | None:
        """Wait until a message from one of ``sources`` (with ``tag``; None: any) is
        waiting and return that source; None after ``timeout`` (default: the peer's). Sleeps
        in the inbox: no polling."""
        return self._comm.wait_any(sources, timeout, tag=tag)

    # -- collectives ------------------------------------------------------------------------
    # Each call with ``wait`` returns its result, or with wait=False a Work whose result it
    # is: the overloads say which to a type checker.
    @overload
    def allreduce(self, x: Array, op: str = "sum", *, wait: Literal[True] = True,
                  timeout: float | None = None, algorithm: str = "auto",
                  compression: CodecSpec = None, residual: Array | None = None) -> Array: ...

    @overload
    def allreduce(self, x: Array, op: str = "sum", *, wait: Literal[False],
                  timeout: float | None = None, algorithm: str = "auto",
                  compression: CodecSpec = None,
                  residual: Array | None = None) -> Work: ...

    @overload
    def allreduce(self, x: Array, op: str = "sum", *, wait: bool = True,
                  timeout: float | None = None, algorithm: str = "auto",
                  compression: CodecSpec = None,
                  residual: Array | None = None) -> Array | Work: ...

    def allreduce(self, x: Array, op: str = "sum", *, wait: bool = True,
                  timeout: float | None = None, algorithm: str = "auto",
                  compression: CodecSpec = None,
                  residual: Array | None = None) -> Array | Work:
        """Reduce ``x`` over all peers in place (ops: sum, mean, max, min, prod; band, bor, bxor
        on integers and bools); returns ``x``,
        or a Work handle with ``wait=False``. ``algorithm``: "auto", or one the communicator
        names (ring, recursive doubling, ...). Every peer calls it with the same op, dtype and
        size, else ProtocolError on all of them; PeerLost or OperationTimeout if a peer dies
        or stalls. ``compression`` ("fp16" | "bf16" | "int8" | "topk:RATIO" or a codec; ops
        sum and mean): fp16/bf16/int8 run the ring on encodings, re-encoding partial sums
        at each hop (error <= n x the codec's bound of sum |x_i|); top-k gathers one
        encoding per peer (error <= the sum of their bounds); both sum in float32 and give
        every peer identical bytes (collectives/algorithms/compressed.py). ``residual``: a
        float32 buffer of x's size for top-k's error feedback, updated in place. Peers must
        pass the same codec, else ProtocolError on every one."""
        return self._comm.allreduce(x, op, wait=wait, timeout=timeout, algorithm=algorithm,
                                    compression=compression, residual=residual)

    @overload
    def reduce_scatter(self, x: Array, op: str = "sum", *, counts: Sequence[int] | None = None,
                       wait: Literal[True] = True, timeout: float | None = None) -> Array: ...

    @overload
    def reduce_scatter(self, x: Array, op: str = "sum", *, counts: Sequence[int] | None = None,
                       wait: Literal[False], timeout: float | None = None) -> Work: ...

    @overload
    def reduce_scatter(self, x: Array, op: str = "sum", *, counts: Sequence[int] | None = None,
                       wait: bool = True, timeout: float | None = None) -> Array | Work: ...

    def reduce_scatter(self, x: Array, op: str = "sum", *, counts: Sequence[int] | None = None,
                       wait: bool = True, timeout: float | None = None) -> Array | Work:
        """Reduce ``x`` over all peers; this peer's segment of the result, a view into ``x``
        (rank r: elements [N*r//n, N*(r+1)//n), or ``counts=`` per peer; errors as allreduce;
        ``wait``, ``timeout``: Communicator.reduce_scatter)."""
        return self._comm.reduce_scatter(x, op, counts=counts, wait=wait, timeout=timeout)

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

    def allgather(self, x: Array, *, out: Array | None = None, variable: bool = False,
                  wait: bool = True, timeout: float | None = None
                  ) -> Array | list[Array] | Work:
        """Every peer's ``x`` in rank order: shape (n, *x.shape) (into ``out`` if given);
        ``variable=True``: sizes may differ, a list of arrays (views into ``out`` if given,
        of the sum of the sizes, contiguous or one-dimensional). Errors as allreduce."""
        return self._comm.allgather(x, out=out, variable=variable, wait=wait, timeout=timeout)

    @overload
    def broadcast(self, x: Array, root: int = 0, *, wait: Literal[True] = True,
                  timeout: float | None = None) -> Array: ...

    @overload
    def broadcast(self, x: Array, root: int = 0, *, wait: Literal[False],
                  timeout: float | None = None) -> Work: ...

    @overload
    def broadcast(self, x: Array, root: int = 0, *, wait: bool = True,
                  timeout: float | None = None) -> Array | Work: ...

    def broadcast(self, x: Array, root: int = 0, *, wait: bool = True,
                  timeout: float | None = None) -> Array | Work:
        """Overwrite ``x`` on every peer with ``root``'s, in place; returns ``x`` (a Work
        handle with ``wait=False``). Errors as allreduce, on the root too."""
        return self._comm.broadcast(x, root, wait=wait, timeout=timeout)

    def broadcast_object(self, obj: Any, root: int = 0, *,
                         timeout: float | None = None) -> Any:
        """``root``'s plain Python value (None, numbers, strings, bytes, lists, tuples,
        dicts) on every peer, as Horovod's ``broadcast_object``, but never pickled: msgpack
        (gossip.objects). Root gets its own back; TypeError on every peer if it is not plain
        values."""
        return broadcast_object(self, obj, root, timeout=timeout)

    def allgather_object(self, obj: Any, *, timeout: float | None = None) -> list[Any]:
        """Every peer's plain Python value, in rank order, as Horovod's
        ``allgather_object`` (never pickled: gossip.objects)."""
        return allgather_object(self, obj, timeout=timeout)

    @overload
    def reduce(self, x: Array, root: int = 0, op: str = "sum", *, wait: Literal[True] = True,
               timeout: float | None = None) -> Array: ...

    @overload
    def reduce(self, x: Array, root: int = 0, op: str = "sum", *, wait: Literal[False],
               timeout: float | None = None) -> Work: ...

    @overload
    def reduce(self, x: Array, root: int = 0, op: str = "sum", *, wait: bool = True,
               timeout: float | None = None) -> Array | Work: ...

    def reduce(self, x: Array, root: int = 0, op: str = "sum", *, wait: bool = True,
               timeout: float | None = None) -> Array | Work:
        """Every peer's ``x`` reduced into the root's, in place (Communicator.reduce)."""
        return self._comm.reduce(x, root, op, wait=wait, timeout=timeout)

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

    def gather(self, x: Array, root: int = 0, *, out: Array | None = None,
               counts: Sequence[int] | None = None, wait: bool = True,
               timeout: float | None = None) -> Array | None | Work:
        """Every peer's ``x`` at the root, in rank order; ``counts``: parts of these sizes
        (MPI's Gatherv) in one flat array (Communicator.gather)."""
        return self._comm.gather(x, root, out=out, counts=counts, wait=wait, timeout=timeout)

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

    def scatter(self, x: Array, root: int = 0, *, out: Array | None = None,
                counts: Sequence[int] | None = None, wait: bool = True,
                timeout: float | None = None) -> Array | Work:
        """Part r of the root's ``x`` into peer r's ``out=``; ``counts``: parts of these sizes
        (MPI's Scatterv) (Communicator.scatter)."""
        return self._comm.scatter(x, root, out=out, counts=counts, wait=wait, timeout=timeout)

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

    def alltoall(self, x: Array, *, out: Array | None = None,
                 send_counts: Sequence[int] | None = None,
                 recv_counts: Sequence[int] | None = None, wait: bool = True,
                 timeout: float | None = None) -> Array | Work:
        """Block j of ``x`` to peer j, equal or ``send_counts=`` (Communicator.alltoall)."""
        return self._comm.alltoall(x, out=out, send_counts=send_counts,
                                   recv_counts=recv_counts, wait=wait, timeout=timeout)

    @overload
    def scan(self, x: Array, op: str = "sum", *, exclusive: bool = False,
             wait: Literal[True] = True, timeout: float | None = None) -> Array: ...

    @overload
    def scan(self, x: Array, op: str = "sum", *, exclusive: bool = False,
             wait: Literal[False], timeout: float | None = None) -> Work: ...

    @overload
    def scan(self, x: Array, op: str = "sum", *, exclusive: bool = False, wait: bool = True,
             timeout: float | None = None) -> Array | Work: ...

    def scan(self, x: Array, op: str = "sum", *, exclusive: bool = False, wait: bool = True,
             timeout: float | None = None) -> Array | Work:
        """Peers 0..r's ``x`` reduced into peer r's, in place; ``exclusive``: peers 0..r-1's,
        rank 0's the op's identity (MPI_Scan, MPI_Exscan; Communicator.scan)."""
        return self._comm.scan(x, op, exclusive=exclusive, wait=wait, timeout=timeout)

    @overload
    def neighbor_allgather(self, x: Array, step: int = 0, *, wait: Literal[True] = True,
                           timeout: float | None = None) -> Array: ...

    @overload
    def neighbor_allgather(self, x: Array, step: int = 0, *, wait: Literal[False],
                           timeout: float | None = None) -> Work: ...

    @overload
    def neighbor_allgather(self, x: Array, step: int = 0, *, wait: bool = True,
                           timeout: float | None = None) -> Array | Work: ...

    def neighbor_allgather(self, x: Array, step: int = 0, *, wait: bool = True,
                           timeout: float | None = None) -> Array | Work:
        """The topology's in-neighbours' ``x`` at ``step``, concatenated along the first axis
        in rank order, ``x`` going to its out-neighbours (BlueFog's neighbor_allgather;
        Communicator.neighbor_allgather for explicit ranks)."""
        return self._comm.neighbor_allgather(x, self.topology.in_neighbors(self.rank, step),
                                             self.topology.out_neighbors(self.rank, step),
                                             wait=wait, timeout=timeout)

    @overload
    def barrier(self, timeout: float | None = None, *,
                wait: Literal[True] = True) -> None: ...

    @overload
    def barrier(self, timeout: float | None = None, *, wait: Literal[False]) -> Work: ...

    def barrier(self, timeout: float | None = None, *, wait: bool = True) -> Work | None:
        """Return once every peer has entered the barrier and this peer's earlier
        non-blocking operations have finished (an error of theirs stays theirs, raised by
        their Work's ``wait``); PeerLost or OperationTimeout naming the peer that never came.
        ``wait=False`` (MPI's Ibarrier): a Work at once, done with the barrier."""
        return self._comm.barrier(timeout, wait=wait)

    def order_ring(self, nbytes: int = 4 << 20, *, repeats: int = 2,
                   margin: float = DEFAULT_MARGIN, timeout: float | None = None) -> list[int]:
        """Measure every link between the peers (``Communicator.measure_links``: a collective
        call, the same arguments on every peer) and order the ring of the ring and
        hierarchical allreduces so that its slowest link is the fastest any order has
        (``LinkRates.ring``: the rank order unless another's slowest link is more than
        ``margin`` faster). Returns the order, every peer the same, and says it on the events
        logger with its slowest link. Where links differ across hosts (a slow uplink, a
        pair of sites), measure once after start-up; the order holds until the membership
        changes (a new view goes back to the rank order: call it again). With several peers
        on some host, only the hosts are ordered: one peer a host (its lowest rank) measures
        the links between hosts, and each host's peers follow each other in the ring, in rank
        order."""
        groups = host_groups(self._transport.hosts, self.world_size)
        by_host = 1 < len(groups) < self.world_size
        rates = self._comm.measure_links(nbytes, repeats=repeats, timeout=timeout,
                                         among=[g[0] for g in groups] if by_host else None)
        order = rates.ring(margin)
        group_of = {g[0]: g for g in groups}   # each host's peers, by its leader
        ring = [rank for leader in order for rank in group_of[leader]] if by_host else order
        self._comm.use_ring(ring)
        events.info("rank %d: %s%s (%s measured each way, best of %d)", self.rank,
                    rates.describe(order), f", ranks {ring}" if by_host else "",
                    _size(nbytes), repeats)
        return ring

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

    def neighbor_exchange(self, x: Array, plan: NeighborPlan, *, scratch: Array | None = None,
                          out: Array | None = None, wait: bool = True,
                          timeout: float | None = None) -> Array | Work:
        """One neighbour exchange as a plan (collectives.NeighborPlan: weights, destinations,
        partial/pattern/codec options): ``x <- plan.self_weight x + sum_j plan.src_weights[j]
        x_j``, in place (into ``out`` if given, ``x`` only sent); ``scratch``: a buffer like
        ``x`` for the received values. Errors and options as neighbor_allreduce;
        Communicator.neighbor_exchange."""
        return self._comm.neighbor_exchange(x, plan, scratch=scratch, out=out, wait=wait,
                                            timeout=timeout)

    @overload
    def neighbor_allreduce(self, x: Array, self_weight: float | None = None,
                           src_weights: Mapping[int, float] | None = None,
                           dst_ranks: Iterable[int] | None = None, *,
                           dst_weights: Mapping[int, float] | Iterable[int] | None = None,
                           scratch: Array | None = None, out: Array | None = None,
                           wait: Literal[True] = True, timeout: float | None = None,
                           partial: bool = False, check_pattern: bool = True,
                           compression: CodecSpec = None) -> Array: ...

    @overload
    def neighbor_allreduce(self, x: Array, self_weight: float | None = None,
                           src_weights: Mapping[int, float] | None = None,
                           dst_ranks: Iterable[int] | None = None, *,
                           dst_weights: Mapping[int, float] | Iterable[int] | None = None,
                           scratch: Array | None = None, out: Array | None = None,
                           wait: Literal[False], timeout: float | None = None,
                           partial: bool = False, check_pattern: bool = True,
                           compression: CodecSpec = None) -> Work: ...

    @overload
    def neighbor_allreduce(self, x: Array, self_weight: float | None = None,
                           src_weights: Mapping[int, float] | None = None,
                           dst_ranks: Iterable[int] | None = None, *,
                           dst_weights: Mapping[int, float] | Iterable[int] | None = None,
                           scratch: Array | None = None, out: Array | None = None,
                           wait: bool = True, timeout: float | None = None,
                           partial: bool = False, check_pattern: bool = True,
                           compression: CodecSpec = None) -> Array | Work: ...

    def neighbor_allreduce(self, x: Array, self_weight: float | None = None,
                           src_weights: Mapping[int, float] | None = None,
                           dst_ranks: Iterable[int] | None = None, *,
                           dst_weights: Mapping[int, float] | Iterable[int] | None = None,
                           scratch: Array | None = None, out: Array | None = None,
                           wait: bool = True, timeout: float | None = None,
                           partial: bool = False, check_pattern: bool = True,
                           compression: CodecSpec = None) -> Array | Work:
        """One neighbour exchange: ``x <- self_weight x + sum_j src_weights[j] x_j``, in
        place, sending ``x`` to ``dst_ranks`` (scaled by ``dst_weights[j]`` if given, as
        push-sum does). ``scratch``: a buffer like ``x`` for the received values (else
        allocated); ``out``: the result goes there and ``x`` is only sent. Patterns must pair
        up (j in my src_weights iff I am in j's dst_ranks), else ValueError naming both ranks;
        PeerLost or OperationTimeout if a neighbour dies or stalls; ``partial=True``: the
        round completes without the neighbours lost during it, then ExchangeIncomplete names
        them; ``check_pattern``, ``compression``: see Communicator.neighbor_exchange. The
        arguments make a NeighborPlan (neighbor_exchange).

        Defaults as BlueFog's ``neighbor_allreduce`` on a weighted topology: without
        ``self_weight`` and ``src_weights`` (give both or neither), the topology's mixing
        weights at step 0 over the live neighbourhood, as ``neighbor_average`` (Metropolis
        weights unless the topology was given others; BlueFog's unweighted default,
        ``1 / (in-degree + 1)`` each, is the same on regular graphs such as the ring, torus
        and exponential graph, and ``weights="uniform"`` on an irregular one); without
        ``dst_ranks``, the keys of ``dst_weights`` (which may also be a plain list of
        distinct ranks, each sent ``x`` itself), else the topology's live out-neighbours."""
        if (self_weight is None) != (src_weights is None):
            raise ValueError(f"rank {self.rank}: neighbor_allreduce: give self_weight and "
                             "src_weights together, or neither for the topology's weights")
        lost = self._transport.lost_ranks()
        if self_weight is None or src_weights is None:
            mixing = live_mixing_round(self.topology, self.rank, 0, lost)
            self_weight, src_weights = mixing.self_weight, mixing.src_weights
        if dst_weights is not None and not isinstance(dst_weights, Mapping):
            dst_ranks, dst_weights = (list(dst_weights) if dst_ranks is None else dst_ranks,
                                      None)
        if dst_ranks is None:
            dst_ranks = (list(dst_weights) if dst_weights is not None else
                         [j for j in self.topology.out_neighbors(self.rank, 0) if j not in lost])
        plan = NeighborPlan.of_call(self.rank, self_weight, src_weights, dst_ranks,
                                    dst_weights=dst_weights, partial=partial,
                                    check_pattern=check_pattern, compression=compression)
        return self.neighbor_exchange(x, plan, scratch=scratch, out=out, wait=wait,
                                      timeout=timeout)

    @overload
    def neighbor_average(self, x: Array, step: int = 0, *, scratch: Array | None = None,
                         wait: Literal[True] = True, timeout: float | None = None,
                         compression: CodecSpec = None) -> Array: ...

    @overload
    def neighbor_average(self, x: Array, step: int = 0, *, scratch: Array | None = None,
                         wait: Literal[False], timeout: float | None = None,
                         compression: CodecSpec = None) -> Work: ...

    @overload
    def neighbor_average(self, x: Array, step: int = 0, *, scratch: Array | None = None,
                         wait: bool = True, timeout: float | None = None,
                         compression: CodecSpec = None) -> Array | Work: ...

    def neighbor_average(self, x: Array, step: int = 0, *, scratch: Array | None = None,
                         wait: bool = True, timeout: float | None = None,
                         compression: CodecSpec = None) -> Array | Work:
        """One gossip round with the topology's mixing weights: x <- sum_j W[rank, j] * x_j
        (D-PSGD) at ``step`` (time-varying topologies). Neighbours already lost are left out
        and the weight of the lost edges is spread over the live neighbourhood: a live
        neighbour j gets W[rank, j] / max(r_rank, r_j), r being a row's weight on live peers
        (self included), and this peer keeps the rest. A symmetric W so stays symmetric, hence
        doubly stochastic, among the survivors: their mean is kept, and on a complete graph
        one round gives every survivor their exact mean (gossip.policies.neighborhood's
        live_mixing_round; it needs the survivors to agree on who is lost). Errors as
        neighbor_allreduce; ``compression`` as there."""
        mixing = live_mixing_round(self.topology, self.rank, step,
                                   self._transport.lost_ranks())
        return self._comm.neighbor_exchange(x, mixing.plan(compression=compression),
                                            scratch=scratch, wait=wait, timeout=timeout)

    # -- observability and lifetime ------------------------------------------------------
    def lost_peers(self) -> dict[int, str]:
        """Ranks this peer has found dead or departed, with the reason."""
        return self._transport.lost_ranks()

    def stats(self) -> dict:
        """Traffic counters (bytes and messages per peer, dropped bad messages, cut
        connections, lost peers, what is held for operations not started) of the current
        view's transport; the totals include the earlier views' too. ``handshakes_refused``
        counts every refused handshake of this peer by direction, wherever it was refused:
        ``handshakes_refused_by_socket`` says where (the data socket, the rendezvous it
        hosted, its membership door)."""
        stats = self._transport.stats()
        for name, value in self._earlier_totals.items():
            stats[name] += value
        # Compressed calls on the main channel: float32 bytes encoded, their encodings'
        # bytes, and payloads refused for not decoding.
        stats["codec"] = self._comm.codec_stats.snapshot()
        if self._membership is not None:
            stats.update(self._membership.stats())
            door = stats["door"]["handshakes_refused"]
            stats["handshakes_refused_by_socket"]["door"] = dict(door)
            refused = stats["handshakes_refused"]
            for reason, n in door.items():
                refused[reason] = refused.get(reason, 0) + n
        return stats

    def start_metrics(self, env: Mapping[str, str] | None = None) -> MetricsService | None:
        """Start the metrics the environment asks for (gossip.init() calls it):
        GOSSIP_METRICS_PORT, GOSSIP_METRICS_FILE, GOSSIP_TENSORBOARD (gossip/metrics/);
        close() stops them. None when none is asked for."""
        from gossip.metrics import MetricsService, MetricsSettings

        settings = MetricsSettings.from_environment(env, rank=self.rank)
        if not settings.enabled or self._metrics is not None:
            return self._metrics
        service = MetricsService(self, settings, rank=self.rank, local_rank=self.local_rank,
                                 world_size=self.world_size)
        service.start()
        self._metrics = service
        return service

    @property
    def metrics(self) -> MetricsService | None:
        """The running metrics exporters (start_metrics), or None."""
        return self._metrics

    def register_policy(self, policy: MembershipParticipant) -> None:
        """Called by Policy.attach: close() will close ``policy`` first."""
        with self._policies_lock:
            if self._closed:
                raise RuntimeError(f"rank {self.rank}: cannot attach a policy to a closed peer")
            if policy not in self._policies:
                self._policies.append(policy)

    def unregister_policy(self, policy: MembershipParticipant) -> None:
        """Called by Policy.close."""
        with self._policies_lock:
            if policy in self._policies:
                self._policies.remove(policy)

    @property
    def policies(self) -> list[MembershipParticipant]:
        """The policies attached to this peer and not yet closed."""
        with self._policies_lock:
            return list(self._policies)

    # -- membership ---------------------------------------------------------------------------
    @property
    def membership(self) -> PeerMembership | None:
        """The peer's membership controller (gossip.membership.PeerMembership: its door,
        view changes and state transfer), None for a peer without membership."""
        return self._membership

    @property
    def view(self) -> View | None:
        """The current membership view (collectives.group.View: number, members with
        name and incarnation, in rank order), or None for a peer without membership."""
        return self._membership.view if self._membership is not None else None

    @property
    def joining(self) -> bool:
        """True from a join until the state of the running job arrived (at the first
        policy's attach): a policy's start collective (Synchronous's broadcast, the anchors'
        or the centre's first average) is skipped, as broadcast_parameters is (entering)."""
        return self._membership is not None and self._membership.joining

    @property
    def entering(self) -> bool:
        """True from a join (a restarted process, a joiner) until this peer's first step of
        its own in the running job: its script's set-up collectives are behind the members,
        so gossip.broadcast_parameters skips them (its state comes from the members when its
        policy attaches)."""
        return self._membership is not None and self._membership.entering

    @property
    def join_stats(self) -> dict[str, object]:
        """A joiner: how its state came (state_bytes, receive_seconds, donors); else {}."""
        return self._membership.join_stats if self._membership is not None else {}

    def track_state(self, name: str, obj: TrackedState) -> None:
        """Send ``obj.state_dict()`` (plain values) with the state a joiner (or a member a
        step behind) takes, and load it there with ``obj.load_state_dict``. An object that
        follows steps (gossip.tracked.StepTracked: an ElasticSampler) is also told of every
        step boundary (at_boundary) and of how a view change goes on (resume_tracked)."""
        if not isinstance(obj, TrackedState):
            raise TypeError(f"track_state({name!r}): {type(obj).__name__} has no "
                            "state_dict() and load_state_dict()")
        self._tracked[name] = obj
        if name in self._pending_tracked:
            obj.load_state_dict(self._pending_tracked.pop(name))

    def tracked_states(self) -> dict[str, Any]:
        """Each tracked object's state_dict(), by the name it was tracked under."""
        return {name: obj.state_dict() for name, obj in self._tracked.items()}

    def load_tracked_states(self, states: dict[str, Any]) -> None:
        """Received tracked states (an ElasticSampler's cursor) into the objects tracked under
        their names; the others wait for their track_state()."""
        for name, state in states.items():
            obj = self._tracked.get(name)
            if obj is not None:
                obj.load_state_dict(state)
            else:
                self._pending_tracked[name] = state

    def resume_tracked(self, complete: bool) -> None:
        """(The membership controller, at a view change this peer keeps its own state
        through.) Tell the tracked objects that follow steps whether the step in progress is
        completed (``complete``) or begun again."""
        for obj in self._tracked.values():
            if isinstance(obj, StepTracked):
                obj.step_resumed(complete)

    def on_view_change(self, callback: Callable[[View], None]) -> None:
        """Call ``callback(view)`` after every view change, in the thread that took it (a
        peer without membership has none)."""
        if self._membership is not None:
            self._membership.on_view_change(callback)

    def changing_now(self) -> bool:
        """True while a membership change that takes effect at once is proposed to this peer
        (a recovery, a leave): a PeerLost meanwhile is that change, not a failure."""
        return self._membership is not None and self._membership.changing_now()

    def leave(self) -> None:
        """Leave the group for good, between steps: the others go on in a view without this
        peer (at once: their operations in progress are ended and each policy takes the
        change), then this peer closes. With a policy whose state must not be cut mid-round
        attached (push-sum), the leave is planned instead: this peer takes that policy's
        rounds (no local update) until the boundary the group agrees on, hands its state
        (x, w) to a member there, then closes (PeerMembership.leave)."""
        if self._membership is not None and not self._closed:
            self._membership.leave()
        self.close()

    def at_boundary(self, policy: MembershipParticipant, step: int) -> bool:
        """Called by a policy after each step (``step`` completed): tell the tracked objects
        that follow steps, then take a view change that takes effect here. True if the view
        changed."""
        for obj in self._tracked.values():
            if isinstance(obj, StepTracked):
                obj.step_completed(step)
        if self._membership is None:
            return False
        return self._membership.at_boundary(policy, step)

    def recover(self, policy: MembershipParticipant, step: int, pending: bool = False) -> int:
        """After a peer was lost mid-step (an elastic policy): agree with the survivors on the
        next view, take the state of the one that completed most steps, and return the step
        count to go on from (``pending``: PeerMembership.recover)."""
        if self._membership is None:
            raise RuntimeError("this peer has no membership (made without gossip.init())")
        return self._membership.recover(policy, step, pending)

    def attached(self, policy: MembershipParticipant) -> None:
        """Called by Policy.attach: a joiner takes the running job's state now."""
        if self._membership is not None:
            self._membership.attached(policy)

    def install_transport(self, transport: Transport) -> tuple[Transport, list[Communicator]]:
        """(The membership controller, at a view change.) Take the new view's ``transport``:
        its traffic totals start from the old one's, a new communicator replaces the old
        (channels are made afresh on their next use), and the topology is recomputed over
        the new size (logged with its spectral gap when it changes). Returns the old
        transport and communicators, which the caller closes once the new view settled."""
        old = self._transport.stats()
        for name in self._earlier_totals:
            self._earlier_totals[name] += old[name]
        retired = (self._transport, [self._comm, *self._channels.values()])
        if self._comm.ring is not None:
            events.info("rank %d: the ring order %s ends with the view; the new view's ring "
                        "is in rank order until order_ring() is called again", self.rank,
                        self._comm.ring)
        transport.recorder.continue_from(self._transport.recorder)
        self._transport = transport
        self._comm = Communicator(transport)
        self._channels = {}
        topology = resize_topology(self.topology, transport.world_size)
        if topology.size != getattr(self.topology, "size", topology.size):
            try:
                gap = f"{topology.spectral_gap():.4f}"
            except Exception:  # a time-varying graph may have none
                gap = "n/a"
            log.info("rank %d: topology recomputed for %d peers: %r (spectral gap %s)",
                     self.rank, topology.size, topology, gap)
        self.topology = topology
        return retired

    def close(self) -> None:
        """Close the attached policies (their background threads stop), let what was sent to
        live peers leave (a send returns once queued: _drain), then stop the worker and I/O
        threads and close every socket (linger 0). Idempotent. Prompt (about a second) with
        operations pending or with nothing queued; with messages queued for a peer that takes
        them, it waits until they left, and for one that takes none for CLOSE_DRAIN_STALL
        (5 s) they are dropped, with a warning naming the peer."""
        if self._closed:
            return
        if self._metrics is not None:   # first: its last write sees the policies' last stats
            try:
                self._metrics.close()
            except Exception as exc:
                log.warning("rank %d: closing the metrics failed: %s", self.rank, exc)
        for policy in reversed(self.policies):
            try:
                policy.close()
            except Exception as exc:  # closing the peer must not fail on a policy
                log.warning("rank %d: closing %r failed: %s", self.rank, policy, exc)
        self._closed = True
        self._drain()
        if self._membership is not None:
            self._membership.close()
        # Transport first: closing it wakes every operation waiting in the inbox, so the
        # worker thread then stops at once.
        # Half of close()'s budget each for the transport and the communicators' workers.
        self._transport.close(timeout=defaults.CLOSE_TIMEOUT / 2)
        for comm in [self._comm, *self._channels.values()]:
            comm.close(timeout=defaults.CLOSE_TIMEOUT / 2)

    def _drain(self) -> None:
        """close()'s first step: a send returns once queued, so what this peer queued for live
        peers goes out before the sockets close (Transport.drain; a peer that takes none of it
        for CLOSE_DRAIN_STALL is given up, with a warning). Not with an operation of this peer
        pending: the close is cutting it short, and its messages would only wait for peers
        that will never take them."""
        comms = [self._comm, *self._channels.values()]
        if any(last is not None and not last.done()
               for last in (comm.engine.last() for comm in comms)):
            return
        self._transport.drain(time.monotonic() + self._transport.config.timeout)

    @property
    def closed(self) -> bool:
        """True once close() has begun."""
        return self._closed

    def __enter__(self) -> "Peer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if not self._closed:
                self.close()
        except Exception:
            pass
