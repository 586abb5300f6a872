"""Allreduce across hosts in two levels (issue #18): the peers of each host reduce among
themselves over the on-host transport (shared-memory rings), only then does anything cross a
host boundary, and the result comes back on each host the same way.

- Every host with the same number of peers k (the common placement, Horovod's hierarchical
  allreduce and NCCL's rings work alike): a ring reduce-scatter on each host leaves the peer
  at local position i with the host's sum of slice (i + 1) % k; the peers of the same local
  position, one per host, allreduce that slice in a ring across the hosts (k such rings run
  at once, each over its own connections); a ring allgather on each host spreads the slices.
  Per peer, 2(H-1)/H of a k-th of the array crosses hosts (H hosts), against 2(n-1)/n of the
  whole for a flat ring whose neighbours sit on other hosts.
- Hosts of different sizes: the host's reduce-scatter, its slices gathered by the host's
  leader (its lowest rank), a ring allreduce among the leaders, then the leader scatters the
  slices back and the host allgathers them.

Each element of the result is reduced by one peer of the cross-host ring and copied to the
others, so every peer ends bitwise identical, as with the flat ring. The host's sums are made
aside (a buffer of the peer's slice; the leader of an unequal host: of the whole array), so
the array only ever holds the peer's own values or results: a call that fails half-way leaves
each element one or the other, as the flat ring does (ring.py). The hosts are the
rendezvous table's host identities (collectives.transport.host_id: host and network
namespace), the same table on every peer, so every peer groups alike.
"""
from __future__ import annotations

from typing import Any

from collectives.algorithms.p2p import Call, post_range, recv_range, wait_sent
from collectives.algorithms.ring import (ring_allgather, ring_allreduce, ring_reduce_scatter,
                                         segments)
from collectives.arrays.adapter import ArrayAdapter

__all__ = ["host_groups", "hierarchical_allreduce", "spans_hosts"]


def host_groups(hosts: dict[int, str], world_size: int,
                ring: list[int] | None = None) -> list[list[int]]:
    """The ranks of each host, in rank order, the hosts ordered by their lowest rank, or with
    ``ring`` (every rank, in a ring order: Communicator.use_ring) by where their first peer
    comes in it."""
    groups: dict[str, list[int]] = {}
    for rank in range(world_size):
        groups.setdefault(hosts.get(rank, f"<rank {rank}>"), []).append(rank)
    ordered = list(groups.values())
    if ring is not None:
        place = {rank: k for k, rank in enumerate(ring)}
        ordered.sort(key=lambda g: min(place[rank] for rank in g))
    return ordered


def spans_hosts(hosts: dict[int, str], world_size: int) -> bool:
    """More than one host, and more than one peer on some host: where two levels help."""
    groups = host_groups(hosts, world_size)
    return 1 < len(groups) < world_size


def hierarchical_allreduce(call: Call, adapter: ArrayAdapter, flat: Any, op: str, *,
                           ring: list[int] | None = None) -> None:
    """Allreduce ``flat`` in place in two levels (module docstring); ``ring``: every rank in
    a ring order, which orders the hosts of the rings across them (host_groups)."""
    t = call.transport
    n, r = t.world_size, t.rank
    groups = host_groups(t.hosts, n, ring)
    local = next(g for g in groups if r in g)
    i, k = local.index(r), len(local)
    count = adapter.size(flat)
    segs = segments(count, k)
    reduce_op = "sum" if op == "mean" else op
    lo, hi = segs[(i + 1) % k]
    if k == 1:   # a host of one: the ring across hosts on the array itself
        hosts = None
    else:   # the host's sums, slice (i + 1) % k at local position i, made aside
        hosts = adapter.empty(hi - lo, adapter.dtype_name(flat), flat)
        wait_sent(call, ring_reduce_scatter(call, adapter, flat, reduce_op, segs=segs,
                                            ring=local, aside=True, into=hosts))
    if all(len(g) == k for g in groups):
        work, start, stop = (flat, lo, hi) if hosts is None else (hosts, 0, hi - lo)
        if len(groups) > 1:   # (every peer of this ring holds its slice alike)
            ring_allreduce(call, adapter, work, op, ring=[g[i] for g in groups], lo=start,
                           hi=stop, divide_by=n)
        elif op == "mean":
            adapter.divide(adapter.slice(work, start, stop), n)
    else:
        _through_leaders(call, adapter, flat, op, groups, local, segs, hosts=hosts)
    if hosts is not None:
        adapter.copy(adapter.slice(flat, lo, hi), hosts)   # the result, at last
        wait_sent(call, ring_allgather(call, adapter, flat, segs=segs, ring=local))


def _through_leaders(call: Call, adapter: ArrayAdapter, flat: Any, op: str,
                     groups: list[list[int]], local: list[int], segs: list[tuple[int, int]],
                     *, hosts: Any) -> None:
    """Hosts of different sizes: the local slices to the host's leader, the leaders'
    allreduce, the slices back (each peer then holds slice (i + 1) % k in ``hosts``, as
    after the host's reduce-scatter, ready for its allgather; a host of one: in ``flat``).
    A leader of several peers gathers its host's sums in a buffer of the whole array."""
    t = call.transport
    k, leader = len(local), local[0]
    if t.rank != leader:
        lo, hi = segs[(local.index(t.rank) + 1) % k]
        wait_sent(call, post_range(call, leader, adapter, hosts, lo, hi, track=True, at=lo))
        for a, b, chunk in recv_range(call, leader, adapter, lo, hi):
            adapter.copy(adapter.slice(hosts, a - lo, b - lo), chunk)
        return
    if hosts is None:   # a host of one: its array is its host's sum
        ring_allreduce(call, adapter, flat, op, ring=[g[0] for g in groups],
                       divide_by=t.world_size)
        return
    lo, hi = segs[1 % k]
    every = adapter.empty(adapter.size(flat), adapter.dtype_name(flat), flat)
    adapter.copy(adapter.slice(every, lo, hi), hosts)
    for j, peer in enumerate(local[1:], start=1):
        a0, b0 = segs[(j + 1) % k]
        for a, b, chunk in recv_range(call, peer, adapter, a0, b0):
            adapter.copy(adapter.slice(every, a, b), chunk)
    ring_allreduce(call, adapter, every, op, ring=[g[0] for g in groups],
                   divide_by=t.world_size)
    adapter.copy(hosts, adapter.slice(every, lo, hi))
    ticket = None
    for j, peer in enumerate(local[1:], start=1):
        a0, b0 = segs[(j + 1) % k]
        ticket = post_range(call, peer, adapter, every, a0, b0, track=True) or ticket
    wait_sent(call, ticket)
