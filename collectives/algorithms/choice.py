"""Which allreduce algorithm a call runs: the user's choice, or "auto" by size and placement.
Every peer of a call must choose alike (they see the same size and, on one host, the same
shared-memory peers); one that does not meets a ProtocolError on every peer, never a wrong
sum, since the algorithm is part of the call's signature."""
from __future__ import annotations

from typing import Any, Callable

from collectives.algorithms.barrier import dissemination_barrier
from collectives.algorithms.hierarchical import hierarchical_allreduce, spans_hosts
from collectives.algorithms.neighbor_direct import DIRECT_NEIGHBOR_MIN_BYTES
from collectives.algorithms.order import SequenceOrder
from collectives.algorithms.ring import ring_allreduce
from collectives.algorithms.shm_allreduce import (SHM_MIN_BYTES, OnHostAllreduce, on_host,
                                              shared_memory_peers)
from collectives.algorithms.shm_copies import OnHostCopies
from collectives.algorithms.shm_neighbor import OnHostNeighbors
from collectives.algorithms.shm_entry import (ANNOUNCEMENT_BYTES, SHARED_COUNTERS, SharedEntry,
                                              shared_barrier)
from collectives.algorithms.shm_small import SMALL_SHM_BYTES, OnHostSmall
from collectives.algorithms.small import recursive_doubling_allreduce
from collectives.neighbor_plan import NeighborPlan

__all__ = ["allreduce_algorithm", "barrier_algorithm", "neighbors_read_directly",
           "neighbors_in_slots", "neighbors_may_use_slots", "gather_may_use_slots",
           "on_host_copies", "ALLREDUCE_ALGORITHMS", "BARRIER_SHAPE", "COPIES_SIGNATURE",
           "OnHost", "RING_ORDERED"]

ALLREDUCE_ALGORITHMS = ("ring", "recursive-doubling", "shm", "shm-small", "hierarchical")
#: The allreduces that go round a ring across hosts, in the order Communicator.use_ring sets
#: (they take it as ``ring=``).
RING_ORDERED = ("ring", "hierarchical")
#: A barrier's call: uint8 of this shape, room for the shared-memory arenas' announcement
#: when a shared-memory barrier is the first such call (shm_entry.exchange_arenas).
BARRIER_SHAPE = (ANNOUNCEMENT_BYTES,)
#: What the signature of a broadcast, allgather, alltoall, gather, scatter or reduce_scatter
#: carries when it runs as on-host copies (shm_copies.py).
COPIES_SIGNATURE = "+shm"


class OnHost:
    """A communicator's shared-memory allreduces (made on first use; closed with it), and
    their order. They share one process-wide state (the arenas, their counters), so each
    runs alone, in sequence order: a blocking call in one thread and a Work on the
    communicator's worker thread would otherwise take turns in different orders on
    different peers, each waiting in shared memory for a call the other has not begun.
    ``reserve`` is called as the sequence number is taken, under the same lock."""

    def __init__(self, rank: int) -> None:
        self.order = SequenceOrder()
        self.entry = SharedEntry(rank, SMALL_SHM_BYTES)   # how every such call is entered
        self.large = OnHostAllreduce(rank, self.entry, self.order)
        self.small = OnHostSmall(self.entry, self.order)
        self.barrier = shared_barrier(self.entry, self.order)
        self.copies = OnHostCopies(self.entry, self.order)
        self.neighbors = OnHostNeighbors(self.entry, self.order)

    def reserve(self, seq: int, algorithm: str) -> None:
        if algorithm in ("shm", "shm-small"):
            self.order.reserve(seq)

    def close(self) -> None:
        self.large.close()
        self.entry.close()


def barrier_algorithm(shm: OnHost, transport: Any) -> tuple[str, Callable]:
    """(name, barrier(call)): through shared memory ("shm") when every other peer is on this
    host with shared memory on x86-64, as the small allreduces; else the dissemination
    barrier over ZeroMQ. The name is part of the call's signature."""
    others = set(range(transport.world_size)) - {transport.rank}
    if SHARED_COUNTERS and others and others <= shared_memory_peers(transport):
        return "shm", shm.barrier
    return "dissemination", dissemination_barrier


def on_host_copies(shm: OnHost, transport: Any, adapter: Any, dtype: str,
                   nbytes: int) -> OnHostCopies | None:
    """The on-host copies (shm_copies.py) a broadcast, allgather, alltoall, gather, scatter
    or reduce_scatter of ``nbytes`` per peer runs as, or None for its ZeroMQ algorithm: with
    shared counters (x86-64), every other peer on this host with shared memory and the array
    in host memory, of a numpy dtype, holding an announcement (on_host). The same answer on
    every peer of one call; the caller reserves its turn (``next_seq("shm")``) and adds
    COPIES_SIGNATURE to its signature."""
    if SHARED_COUNTERS and on_host(transport, adapter, dtype, nbytes):
        return shm.copies
    return None


def allreduce_algorithm(name: str, dtype: str, nbytes: int, small_bytes: int,
                        shm: OnHost, transport: Any, adapter: Any) -> tuple[str, Callable]:
    """(name, algorithm(call, adapter, flat, op)) for ``name``. "auto": where the
    shared-memory allreduces can run (on_host) on x86-64, "shm-small" up to SMALL_SHM_BYTES
    and "shm" above (entered through shared memory, 50 us at n = 2: shm_entry.py); elsewhere
    recursive doubling up to ``small_bytes``, then "shm" from SHM_MIN_BYTES where it can run
    (announced over ZeroMQ), else "hierarchical" where the peers span hosts with more than one
    peer on some host (hierarchical.py), else the ring. ValueError for an unknown name, or a
    shared-memory one where it cannot run."""
    here = on_host(transport, adapter, dtype, nbytes)
    small_here = here and SHARED_COUNTERS and nbytes <= SMALL_SHM_BYTES
    if name == "auto":
        if here and SHARED_COUNTERS:
            name = "shm-small" if small_here else "shm"
        elif nbytes <= small_bytes:
            name = "recursive-doubling"
        elif here and nbytes >= SHM_MIN_BYTES:
            name = "shm"
        else:
            name = ("hierarchical" if spans_hosts(transport.hosts, transport.world_size)
                    else "ring")
    if name not in ALLREDUCE_ALGORITHMS:
        raise ValueError(f"unknown allreduce algorithm {name!r}; use 'auto', "
                         + ", ".join(f"'{a}'" for a in ALLREDUCE_ALGORITHMS))
    if name == "shm-small":
        if not small_here:
            raise ValueError("allreduce algorithm 'shm-small' needs every peer on this host "
                             "with shared memory (x86-64), and an array in host memory of a "
                             f"numpy dtype, of {ANNOUNCEMENT_BYTES} bytes to 64 KiB")
        return name, shm.small
    if name == "shm":
        if not here:
            raise ValueError("allreduce algorithm 'shm' needs every peer on this host with "
                             "shared memory, and an array in host memory of a numpy dtype "
                             f"and at least {ANNOUNCEMENT_BYTES} bytes")
        return name, shm.large
    return name, {"ring": ring_allreduce, "hierarchical": hierarchical_allreduce,
                  "recursive-doubling": recursive_doubling_allreduce}[name]


def neighbors_may_use_slots(shm: OnHost, transport: Any, plan: NeighborPlan, *,
                            adapter: Any, dtype: str, nbytes: int) -> bool:
    """Whether a neighbour exchange of ``plan`` may go through the slots of the shared-memory
    entry (shm_neighbor.py): with shared counters (x86-64), every other peer on this host with
    shared memory, an array in host memory of a numpy dtype that fits a slot with its
    pattern (below DIRECT_NEIGHBOR_MIN_BYTES, so never where the direct reads would be
    chosen), and not a partial round. The same answer on every peer of one call (the same
    size, and the same kind of plan); the caller reserves its turn (``next_seq("shm")``)
    and asks neighbors_in_slots as the call runs."""
    return (SHARED_COUNTERS and not plan.partial and nbytes < DIRECT_NEIGHBOR_MIN_BYTES
            and shm.neighbors.fits(transport.world_size, nbytes)
            and on_host(transport, adapter, dtype, nbytes))


def gather_may_use_slots(shm: OnHost, transport: Any, *, adapter: Any, dtype: str) -> bool:
    """Whether a neighbour allgather may go through the shared-memory entry
    (OnHostNeighbors.allgather): with shared counters (x86-64), every other peer on this
    host with shared memory, an array in host memory of a numpy dtype. Decided from the
    placement and the dtype alone, never from this peer's size (the peers' differ), so the
    same on every peer; the caller reserves its turn and asks neighbors_in_slots."""
    return SHARED_COUNTERS and on_host(transport, adapter, dtype, ANNOUNCEMENT_BYTES)


def neighbors_in_slots(shm: OnHost, transport: Any, seq: int, deadline: float, *,
                       operation: str = "neighbor_allreduce") -> bool:
    """(A call neighbors_may_use_slots allowed, its turn reserved.) Whether it goes through
    the slots: once the peers' arenas are mapped, which the first shared-memory call of
    every peer does (a broadcast_parameters, a barrier, an allreduce on this host), so a
    round never maps them itself (a mapping is every peer's call, and a round involves its
    neighbours only). It waits for this peer's earlier shared-memory calls first, so every
    peer answers alike; if not, its reserved turn is given up (the copying exchange)."""
    try:
        shm.order.wait_before(seq, deadline, transport, f"{operation} at sequence {seq}")
    except BaseException:
        shm.order.release(seq)
        raise
    if shm.entry.arenas is not None:
        return True
    shm.order.release(seq)
    return False


def neighbors_read_directly(shm: OnHost, transport: Any, seq: int, deadline: float,
                            plan: NeighborPlan, *, adapter: Any, dtype: str,
                            nbytes: int) -> bool:
    """Whether neighbour exchange ``seq`` of ``plan`` reads its sources' arrays
    (neighbor_direct.py): never for a partial round (a lost peer's memory cannot be read);
    from DIRECT_NEIGHBOR_MIN_BYTES, every peer of it on this host, an array in host memory
    numpy reads, and every peer able to read every other's, as the shared-memory entries
    before ``seq`` said. It waits for those entries first (this peer's earlier shared-memory
    calls), so every peer of the exchange answers alike."""
    if plan.partial or nbytes < DIRECT_NEIGHBOR_MIN_BYTES or \
            not on_host(transport, adapter, dtype, nbytes, plan.peers):
        return False
    shm.order.wait_before(seq, deadline, transport, f"neighbor_allreduce at sequence {seq}")
    return shm.entry.direct is True
