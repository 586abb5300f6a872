"""The sharded EASGD centre in a view (asynchronous EASGD): peer r owns segment r of each
flat bucket of the centre and serves the workers' elastic exchanges with it from a thread;
with ``elastic=True`` every owner's updates are forwarded to its backup, the next rank, which
keeps a replica of the shard. A mixin of ElasticAveraging (gossip/policies/elastic_averaging.py
has the rule and its cost in its docstring; elastic_sharded_membership.py what a view change
does to the shards); the attributes it reads (_peer, _buckets, _lock, _channel_number,
_dropped, ...) are ElasticAveraging's, BackgroundPolicy's and Policy's.

Threads: the server (requests in, updates forwarded, replies out) and, with backups, the
backup thread (forwards in). The training thread touches the centre only for its own
segment, under ``_lock``, which also orders the forwards: the replica applies the updates in
the order the primary did, so it stays the primary's bytes.
"""
from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterator

import numpy as np

from collectives.arrays import adapter_for, segment
from gossip.errors import GossipError, PeerLost, ProtocolError
from gossip.policies.failures import PEER_FAILURES, Attempt

__all__ = ["ShardedCentre", "BACKUP_CHANNEL_OFFSET"]

log = logging.getLogger("gossip")

# The backups' channel is channel + 3 (4 + 3 = PeerChannel.ELASTIC_BACKUPS): channel + 2 is
# HEALING's with the default numbers.
BACKUP_CHANNEL_OFFSET = 3


class ShardedCentre:
    """The sharded centre's owners, server and backups (see the module docstring)."""

    _forwards = 0   # updates forwarded to this peer's backup
    _layout: tuple | None = None   # the members the shards are cut over: (name, incarnation)

    # ------------------------------------------------------------------ layout
    def _lay_out(self, centres: list, *, start: bool) -> None:
        """(Sharded.) Cut ``centres`` (the whole centre, one flat buffer per bucket, the same
        bytes on every member) over the current view: this peer's shard of each bucket, with
        ``elastic`` the replica of its predecessor's, the buffers and channels of the
        exchange; then, with ``start``, the server (and backup) threads."""
        peer, buckets = self._peer, self._buckets
        n, rank = peer.world_size, peer.rank
        self._segs = [[segment(b.numel, s, n) for s in range(n)] for b in buckets]
        self._center = []
        for m, segs in zip(centres, self._segs):
            lo, hi = segs[rank]
            self._center.append(adapter_for(m).clone(m[lo:hi]))
        self._backing = self.elastic and n > 1
        self._backup, self._pred = (rank + 1) % n, (rank - 1) % n
        self._replica = [adapter_for(m).clone(m[slice(*segs[self._pred])])
                         for m, segs in zip(centres, self._segs)] if self._backing else []
        self._from_pred = [adapter_for(r).clone(r) for r in self._replica]
        self._header = np.zeros(1, dtype=np.int64)   # a forward's bucket index
        self._header_in = np.zeros(1, dtype=np.int64)
        self._own_diff = [adapter_for(c).clone(c) for c in self._center]
        self._replies = [[b.new(numel=hi - lo) if s != rank else None
                          for s, (lo, hi) in enumerate(segs)]
                         for b, segs in zip(buckets, self._segs)]
        self._requests = [adapter_for(c).clone(c) for c in self._center]
        self._req_comm = peer.channel(self._channel_number)
        self._rep_comm = peer.channel(self._channel_number + 1)
        self._bak_comm = peer.channel(self._channel_number + BACKUP_CHANNEL_OFFSET)
        # The buckets whose segment of this peer is not empty, in order: what every worker
        # sends this peer, bucket after bucket.
        self._served_buckets = [k for k, segs in enumerate(self._segs)
                                if segs[rank][1] > segs[rank][0]]
        self._next_request = {j: 0 for j in range(n) if j != rank}
        with self._cond:
            self._dropped = {}   # the old view's ranks: every member of this one is live
        self._layout, self._layout_rank = self._view_members(), rank
        if start and self._served_buckets and n > 1:
            self._start(self._serve, "gossip-easgd")
        if start and self._backing and any(r.shape[0] for r in self._replica):
            self._start(self._keep_replica, "gossip-easgd-backup")

    def _view_members(self) -> tuple | None:
        """The current view's members as (name, incarnation) in rank order (None: a peer
        without membership)."""
        view = getattr(self._peer, "view", None)
        return None if view is None else tuple((m.name, m.incarnation) for m in view.members)

    # ------------------------------------------------------------------ the round
    def _sharded_round(self) -> None:
        """Each segment to its owner, each answer subtracted. Without ``elastic`` a lost owner
        is skipped (dropped for the view); with it a lost owner fails the round (PeerLost: a
        view change, _recover), whose moves so far stay: each is one elastic exchange."""
        rank, alpha = self._peer.rank, self.alpha
        lost = self._peer.lost_peers()
        if self.elastic and lost:
            gone = min(lost)
            raise PeerLost(f"rank {rank}: {self.name}: centre shard owner {gone} lost before "
                           f"the elastic round: {lost[gone]}", rank=gone,
                           operation="elastic averaging round")
        asked = []
        for k, (b, segs) in enumerate(zip(self._buckets, self._segs)):
            for s, (lo, hi) in enumerate(segs):
                if hi == lo:
                    continue
                if s == rank:
                    with self._lock:   # the server thread updates the same shard
                        d = self._own_diff[k]
                        adapter_for(d).copy(d, b.flat[lo:hi])
                        d -= self._center[k]
                        d *= alpha
                        self._center[k] += d
                        if self._backing:   # a lost backup fails an elastic round
                            self._forward(k, d)
                    b.flat[lo:hi] -= d
                    continue
                if not self._alive(s, lost):
                    continue
                with self._attempt(f"request to centre shard owner {s}", s):
                    self._req_comm.send(s, b.flat[lo:hi], timeout=self.timeout)
                    asked.append((k, s))
        for k, s in asked:
            if s in self._dropped:
                continue
            lo, hi = self._segs[k][s]
            reply = self._replies[k][s]
            with self._attempt(f"reply of centre shard owner {s}", s) as attempt:
                self._rep_comm.recv(s, reply, timeout=self.timeout)
            if attempt.failed:
                continue
            self._buckets.buckets[k].flat[lo:hi] -= reply

    @contextlib.contextmanager
    def _attempt(self, what: str, rank: int) -> Iterator[Attempt]:
        """An exchange with centre shard owner ``rank``: without ``elastic`` under the failure
        rule (a failure drops the owner), with it as it is (a failure is the round's)."""
        if not self.elastic:
            with self._tolerate(what, rank=rank) as attempt:
                yield attempt
            return
        yield Attempt()

    def _forward(self, k: int, d: Any) -> None:
        """(Holding _lock, right after ``c_k += d``.) The same d to this shard's backup, in
        the order the updates are applied, so its replica stays the primary's bytes."""
        self._header[0] = k
        self._bak_comm.send(self._backup, self._header, timeout=self.timeout)
        self._bak_comm.send(self._backup, d, timeout=self.timeout)
        self._forwards += 1

    # ------------------------------------------------------------------ shard server
    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self._serve_pending():
                lost = self._peer.lost_peers()
                self._next_source(self._req_comm, [j for j in self._next_request
                                                   if j not in self._dropped
                                                   and j not in lost])

    def _serve_pending(self) -> bool:
        served = False
        alpha = self.alpha
        for src, pos in self._next_request.items():
            while (src not in self._dropped and not self._peer.lost_peers().get(src)
                   and self._req_comm.probe(src)):
                k = self._served_buckets[pos]
                req = self._requests[k]
                try:
                    with self._tolerate(f"request from rank {src}") as attempt:
                        self._req_comm.recv(src, req, timeout=self.timeout)
                except GossipError as exc:
                    log.warning("rank %d: elastic averaging: bad request from rank %d: %s",
                                self._peer.rank, src, exc)
                    break
                if attempt.failed:
                    break
                with self._lock:
                    req -= self._center[k]
                    req *= alpha          # d = alpha (x_s - c_s)
                    self._center[k] += req
                    if self._backing:
                        try:
                            self._forward(k, req)
                        except PEER_FAILURES as exc:
                            # The backup is lost: the primary, here, is whole; the view
                            # change that follows makes a new backup.
                            log.warning("rank %d: elastic averaging: forward to backup rank "
                                        "%d failed: %s", self._peer.rank, self._backup, exc)
                            self._backing = False
                # A worker gone meanwhile misses its reply; the centre kept its pull.
                with self._tolerate(f"reply to rank {src}"):
                    self._rep_comm.send(src, req, timeout=self.timeout)
                pos = (pos + 1) % len(self._served_buckets)
                self._next_request[src] = pos
                self._served += 1
                served = True
        return served

    def _keep_replica(self) -> None:
        """(Backup thread.) Add each update the predecessor forwards to its replica."""
        while not self._stop.is_set():
            if self._next_source(self._bak_comm, [self._pred]) is not None:
                if not self._take_forward():
                    return

    def _take_forward(self) -> bool:
        """One forwarded update (its bucket index, then d) into the replica; False once the
        predecessor is lost (what it sent before is in already) or sent a bad index."""
        pred = self._pred
        try:
            self._bak_comm.recv(pred, self._header_in, timeout=self.timeout)
            k = int(self._header_in[0])
            if not 0 <= k < len(self._replica) or not self._replica[k].shape[0]:
                raise ProtocolError(f"rank {self._peer.rank}: centre shard owner {pred} "
                                    f"forwarded an update of bucket {k}, which has no "
                                    "segment of it (elastic averaging backup)")
            d = self._from_pred[k]
            self._bak_comm.recv(pred, d, timeout=self.timeout)
        except (ProtocolError, *PEER_FAILURES) as exc:
            log.warning("rank %d: elastic averaging: backup of rank %d's shard stops: %s",
                        self._peer.rank, pred, exc)
            return False
        self._replica[k] += d
        return True
