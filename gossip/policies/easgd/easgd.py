"""Elastic averaging SGD (EASGD): workers tied to a centre variable by an elastic force
(ElasticAveraging, whose docstring has the rule), its centre replicated on every worker or
sharded over them, and how the centre follows a membership view change.

The sharded centre in a view (asynchronous EASGD): peer r owns segment r of each flat
bucket of the centre and serves the workers' elastic exchanges with it from a thread; with
``elastic=True`` every owner's updates are forwarded to its backup, the next rank, which
keeps a replica of the shard (the class docstring has the rule and its cost).

Threads: the server (requests in, updates forwarded, replies out) and, with backups, the
backup thread (forwards in). The training thread touches the centre only for its own
segment, under ``_lock``, which also orders the forwards: the replica applies the updates in
the order the primary did, so it stays the primary's bytes.

The sharded centre across membership view changes: a join, a planned leave, and with
``elastic=True`` a death. The replicated centre needs none of this (every member holds all of
it): each membership hook does nothing more for it.

The rule: the centre is one flat buffer per bucket, cut into n segments (segment s, of
collectives.arrays.segment, owned by dense rank s of the view). At every view change it is
cut again over the new view, and the assembled centre after the change is the assembled
centre before it, bitwise: its segments are copied, never summed.

At a committed switch (gossip/membership/controller.py, take_switch):

1. ``view_changing`` (old view's transport, every old member; the server and backup threads
   stop first, once every planned leaver said it is at its boundary: a leaver is no member
   of the committed view, so the others may reach the boundary while its last rounds still
   need their servers). Every member computes the same *plan* from the layout its shards are cut in
   (the old view's members, by name and incarnation), the new view and the commit's
   handoffs (reshard.py's ``reshard_plan``): for each old segment, the new rank of the member that
   provides it. That is its owner if the owner goes on as itself; else the member a planned
   leaver handed it to; else, with ``elastic``, its backup (the owner's next rank, whose
   replica has every update the owner applied: it first takes what the dead owner forwarded
   and is still queued); else nobody (-1). A member named in a handoff receives the leaver's
   shard here (PeerChannel.HANDOFF), as push-sum takes a leaver's mass.
2. The switch's source sends the joiners its model as any member would
   (gossip/membership/state_transfer.py), with the plan in place of its own shard in the
   policy state: the joiners cannot make the plan themselves (they never saw the old view).
3. ``settle_view`` (new view's transport, every member of the new view, joiners too, after
   the state moved and before the barrier that ends the switch): one allgather per bucket
   (variable sizes) of the segments each member provides, so every member assembles the
   whole centre; each keeps its new segment (and, with ``elastic``, the replica of its new
   predecessor's), and the threads start again over the new view. A segment nobody provides
   (an owner and its backup both lost, or a death without ``elastic``) is rebuilt as the mean
   of the workers' copies of it over the members that go on (one allreduce of the bucket,
   only then), logged and counted in ``stats()["segments_rebuilt"]``: that is the one case
   in which the centre is not conserved.

A planned ``peer.leave()`` (``hands_off_at_leave``): the leaver takes rounds until the
boundary the group agrees on, then ``hand_off`` sends its shards to the member the commit
names (its next rank that goes on). A leave that is not committed in time is a leave at once
(gossip/membership/controller.py): its shards then come from its backup (``elastic``) or are
rebuilt.

What this costs: per view change, an allgather of the centre (each member receives P, the
centre's bytes, in a ring; about a third of one elastic round's traffic of the whole group)
and transient memory of P per member; plus the plan in the joiner's state (n_old + n_new
integers). With ``elastic``, the backup costs P more bytes per elastic step of every worker
(each update is forwarded once more: requests P, replies P, forwards P) and a replica of
1/n of the centre per member; the forwards run on the owners' threads, never on the
training thread of the worker that asked, except for its own shard.

What is not kept: a request the owner served whose reply its worker never read (the worker's
round was ended by the change) moved the centre and not the worker (one-sided, as a lost
reply between changes); forwards still in flight when an owner dies are lost with it (the
backup has every one that reached its inbox). A death during the allgather of step 3 itself
re-forms the group again from the layout each member still holds; members whose allgather
completed while others' failed would then hold different layouts, which the next plan's
sizes reveal (ProtocolError naming the rank) rather than mix.
"""
from __future__ import annotations

import contextlib
import logging
import warnings
from typing import Any, Iterator

import numpy as np

from collectives import Work
from collectives.arrays import adapter_for, segment
from collectives.codecs import CodecSpec
from collectives.group import Switch
from gossip.errors import GossipError, PeerLost, ProtocolError
from gossip.peer_channels import PeerChannel
from gossip.policies.base import (DEFAULT_BUCKET_BYTES, PEER_FAILURES, Attempt,
                                  BackgroundPolicy, check_int, check_number)
from gossip.policies.easgd.reshard import check_plan, reshard_plan

__all__ = ["ElasticAveraging", "CENTERS", "DEFAULT_BETA", "BACKUP_CHANNEL_OFFSET"]

log = logging.getLogger("gossip")

CENTERS = ("replicated", "sharded")
# The paper's moving rate beta = n * alpha (Zhang et al. use 0.9 in every experiment).
DEFAULT_BETA = 0.9
# The backups' channel is channel + 3 (4 + 3 = PeerChannel.ELASTIC_BACKUPS): channel + 2 is
# HEALING's with the default numbers.
BACKUP_CHANNEL_OFFSET = 3


class ElasticAveraging(BackgroundPolicy):
    """EASGD (Zhang, Choromanska, LeCun 2015). Each worker i trains its own x_i; every
    ``period`` (tau) steps it is pulled towards a centre c and the centre towards it:
    ``d_i = alpha (x_i - c); x_i -= d_i; c += d_i``. The workers explore around the centre,
    which is the model to evaluate (``policy.center``, or load_center()).

    ``center="replicated"`` (synchronous EASGD): every peer keeps the whole centre; one
    allreduce of the elastic differences per round, ``c += sum_i d_i``, keeps the centres
    bitwise identical. Invariant of a round: ``sum_i x_i + c`` is unchanged (the workers lose
    exactly what the centre gains). Cost: one allreduce of P bytes every tau steps.
    ``compression`` (replicated only): the differences d_i travel encoded (top-k with error
    feedback); the centre gains their decoded sum, identical everywhere, so the invariant
    holds to the codec's error per round (plus the residuals, with top-k).

    ``center="sharded"`` (asynchronous EASGD): peer r owns segment r of each flat bucket of
    the centre. At its elastic step a worker sends its segment s to owner s (on
    ``peer.channel(channel)``); the owner's background thread computes
    ``d = alpha (x_s - c_s)``, applies ``c_s += d`` and answers d (on channel + 1), which the
    worker subtracts. Requests are served one at a time, whenever they arrive, so a worker
    waits only for the owners' server threads, never for another worker's training step.
    Cost: P bytes out and P bytes back per elastic step, spread over the owners; each peer
    stores 1/n of the centre. Close the policies after a barrier: a worker still training
    cannot reach the shard of a peer that has closed (it then skips that shard; with
    ``elastic=True`` the closed peer is a death, and the others re-form without it). With
    ``elastic=True`` every owner also keeps a backup of its shard at the next rank: each
    update d it applies, in the order it applies them, is forwarded to that rank (on
    channel + 3), whose thread adds it to its replica, so the replica stays the primary's
    bytes and a death loses no centre (see the module docstring). That costs P more
    bytes per elastic step of every worker (each d once more), off the training thread.

    Defaults: ``alpha = 0.9 / n`` (the paper's beta = n alpha = 0.9), ``period=4``. The
    centre starts at the workers' mean (an allreduce at attach).

    Stability (the paper's linear analysis of synchronous EASGD on f(x) = h x^2 / 2 with step
    eta, tau = 1): the workers' mean m and the centre evolve by
    ``[[1 - eta h - alpha, alpha], [beta, 1 - beta]]``, stable iff ``eta h > 0``,
    ``beta > 0``, ``|det| < 1`` and ``(2 - eta h)(2 - beta) > 2 alpha``. With no gradient at
    all that is ``alpha + beta < 2``: past it the elastic exchange diverges by itself whatever
    the learning rate, so the replicated form refuses it (ValueError), as it refuses alpha
    outside (0, 1) (the disagreement x_i - m shrinks by 1 - alpha per round). ``beta >= 1``
    is legal but suspicious (the centre overshoots the mean and the condition tightens to
    ``eta h < 2 - 2 alpha / (2 - beta)``): a warning. The sharded form applies the elastic
    move one worker at a time, each a convex combination for 0 < alpha < 1, so only alpha is
    restricted there.

    Membership (replicated centre): a joiner takes a member's state (its worker, optimizer
    and the centre) at a step boundary. ``elastic=True``: a lost peer does not end training;
    the survivors agree on a new view at once and go on (fewer than ``min_peers``: PeerLost).
    A round's allreduce that a death ends changes nothing on the peers where it failed (the
    elastic move applies only once the whole round arrived), so the centre is the round's
    either everywhere it completed or nowhere; a survivor whose round failed while others'
    completed is behind their step count, and takes the state of the survivor that
    completed most steps, centre included (``shared_state``). Without ``elastic`` a death
    in a round raises PeerLost, as Synchronous's.

    Membership (sharded centre): at every view change the centre is cut again over the new
    view's dense ranks, and a joiner takes its model from a member and its shards from the
    members; a planned ``peer.leave()`` hands the leaver's shards over; with ``elastic=True``
    a death is a view change and the dead owner's shards come from their backups. The
    assembled centre is the same bytes after a change as before it.
    The module docstring has the rules and what each costs. Without ``elastic`` a
    death costs the dead owner's shards until the next view change (its workers skip them,
    see ``dropped_peers``), which rebuilds them from the workers.
    """

    name = "easgd"
    aliases = ("elastic",)   # its earlier name: make("elastic") and old state dicts still work
    worker_name = "elastic-averaging server thread"

    def __init__(self, *, alpha: float | None = None, period: int = 4,
                 center: str = "replicated", channel: int = PeerChannel.ELASTIC_REQUESTS,
                 poll_interval: float = 0.25,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, timeout: float | None = None,
                 nan_guard: bool = False, elastic: bool = False, min_peers: int = 1,
                 compression: CodecSpec = None) -> None:
        super().__init__(channel=channel, poll_interval=poll_interval,
                         bucket_bytes=bucket_bytes, timeout=timeout, nan_guard=nan_guard,
                         compression=compression)
        if compression is not None and center != "replicated":
            raise ValueError("compression needs center='replicated' (its allreduce of the "
                             "elastic differences is compressed); the sharded centre's "
                             "point-to-point shards are not")
        self.elastic = bool(elastic)
        self.min_peers = check_int("min_peers", min_peers, 1)
        if alpha is not None:
            check_number("alpha", alpha, lambda a: 0 < a < 1, "in (0, 1)",
                         note=": the elastic move x -= alpha (x - c) overshoots the centre "
                              "for alpha >= 1")
            if alpha < 1e-4:
                warnings.warn(f"alpha={alpha:g} is so small that the workers barely feel the "
                              "centre: they train almost independently", UserWarning,
                              stacklevel=2)
        check_int("period", period)
        if center not in CENTERS:
            raise ValueError(f"center must be one of {', '.join(map(repr, CENTERS))}, got "
                             f"{center!r}")
        self._alpha_arg = None if alpha is None else float(alpha)
        self.period = period
        self.center_mode = center
        self._served = 0
        self._rounds = 0
        self._forwards = 0   # updates forwarded to this peer's backup
        # The members the shards are cut over: (name, incarnation) by rank (None: the
        # replicated centre, or a peer without membership), and this member's rank then.
        self._layout: tuple | None = None
        self._layout_rank = 0
        self._plan: dict | None = None   # the re-shard of the switch under way
        self._held: dict = {}   # old segment -> its buffers (one per bucket) this member provides
        self._reshards = 0
        self._rebuilt = 0

    # ------------------------------------------------------------------ set-up
    def _primitives(self) -> None:
        super()._primitives()
        # The centre shard, between the server thread and the training thread.
        self._lock = self._concurrency.lock()

    @property
    def alpha(self) -> float:
        """The elastic rate (default 0.9 / n, known once attached: RuntimeError before)."""
        if self._alpha_arg is not None:
            return self._alpha_arg
        if self._peer is None:
            raise RuntimeError("alpha defaults to 0.9 / n: attach the policy first")
        return DEFAULT_BETA / self._host().world_size

    @property
    def beta(self) -> float:
        """The paper's moving rate of the centre, n * alpha."""
        return self.alpha * self._host().world_size

    def _check_stability(self) -> None:
        n, alpha = self._host().world_size, self.alpha
        if not 0 < alpha < 1:  # the default 0.9 / n with n = 1 is 0.9
            raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
        if self.center_mode != "replicated":
            return
        beta = n * alpha
        if alpha + beta >= 2:
            raise ValueError(
                f"alpha={alpha:g} with {n} peers gives beta = n alpha = {beta:g}: the "
                f"replicated elastic exchange diverges when alpha + beta >= 2 (the centre-mean "
                f"mode is multiplied by 1 - alpha - beta = {1 - alpha - beta:g} per round); "
                f"use alpha < {2 / (n + 1):.4g}, e.g. the default 0.9 / n = {0.9 / n:.4g}")
        if beta >= 1:
            warnings.warn(f"beta = n alpha = {beta:g} >= 1: the centre overshoots the workers' "
                          "mean each round, and stability then needs a smaller learning rate "
                          "than plain SGD; the paper uses beta = 0.9", UserWarning, stacklevel=4)

    #: Both centres follow a view change. The replicated one: every member holds all of it
    #: (the same bytes), so a joiner takes it with a member's state and the next round's
    #: allreduce runs over the new view (alpha's default, 0.9 / n, follows n). The sharded
    #: one is cut again over the new view (the module docstring).
    follows_view_changes = True

    @property
    def shared_state(self) -> bool:
        """The replicated centre is the same bytes on every member (see Policy)."""
        return self.center_mode == "replicated"

    def max_drift(self) -> int | None:
        # The replicated centre's rounds are allreduces every period steps.
        return self.period if self.center_mode == "replicated" else None

    def _setup(self) -> None:
        self._check_stability()
        peer, buckets = self._host(), self._packed()
        n, rank = peer.world_size, peer.rank
        buckets.copy_in()
        # The centre starts at the workers' mean; a joiner's comes with the running job's
        # state (Peer.attached, after this), so it makes no collective call here.
        joining = peer.joining
        means = []
        for b in buckets:
            m = adapter_for(b.flat).clone(b.flat)
            if not joining:
                peer.allreduce(m, op="mean", timeout=self.timeout)
            means.append(m)
        if self.center_mode == "replicated":
            self._center = means
            self._diff = [b.new() for b in buckets]   # sum_i d_i, by allreduce
            self._own = [b.new() for b in buckets]    # this worker's d_i
            return
        # A joiner's centre is cut from the members' shards once it has its state
        # (settle_view): until then nothing serves, and these means are placeholders.
        self._lay_out(means, start=not joining)

    # ------------------------------------------------------------------ the step
    def _after_step(self, step: int) -> None:
        if (step + 1) % self.period:
            return
        self._check_worker()
        self._packed().copy_in()
        if self.center_mode == "replicated":
            self._replicated_round()
        else:
            self._sharded_round()
        self._packed().copy_out()
        self._rounds += 1

    def _replicated_round(self) -> None:
        """d_i = alpha (x_i - c) summed by allreduce; then x_i -= d_i and c += sum_i d_i,
        only once every bucket's sum arrived: a round a lost peer ended (PeerLost) leaves x
        and c as they were, so no survivor holds a centre that is half of a round."""
        alpha = self.alpha
        work: list[Work] = []
        for b, c, d, own in zip(self._packed(), self._center, self._diff, self._own):
            adapter = adapter_for(own)
            adapter.copy(own, b.flat)
            own -= c
            own *= alpha        # d_i = alpha (x_i - c)
            adapter.copy(d, own)
            # With a codec the differences are encoded (top-k: with error feedback); the
            # centre gains their decoded sum, identical on every peer.
            work.append(self._host().allreduce(d, op="sum", wait=False, timeout=self.timeout,
                                               **self._compression.kwargs(len(work), d)))
        lost = None
        for w in work:
            try:
                w.wait(self.timeout)
            except PeerLost as exc:   # the others end too: none writes after this
                lost = lost or exc
        if lost is not None:
            raise lost
        for b, c, d, own in zip(self._packed(), self._center, self._diff, self._own):
            b.flat -= own       # x_i -= d_i
            c += d              # c += sum_i d_i: the same bytes on every peer

    # ------------------------------------------------------------------ sharded: layout
    def _lay_out(self, centres: list, *, start: bool) -> None:
        """(Sharded.) Cut ``centres`` (the whole centre, one flat buffer per bucket, the same
        bytes on every member) over the current view: this peer's shard of each bucket, with
        ``elastic`` the replica of its predecessor's, the buffers and channels of the
        exchange; then, with ``start``, the server (and backup) threads."""
        peer, buckets = self._host(), self._packed()
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
        view = self._host().view
        return None if view is None else tuple((m.name, m.incarnation) for m in view.members)

    # ------------------------------------------------------------------ sharded: the round
    def _sharded_round(self) -> None:
        """Each segment to its owner, each answer subtracted. Without ``elastic`` a lost owner
        is skipped (dropped for the view); with it a lost owner fails the round (PeerLost: a
        view change, _recover), whose moves so far stay: each is one elastic exchange."""
        rank, alpha = self._host().rank, self.alpha
        lost = self._host().lost_peers()
        if self.elastic and lost:
            gone = min(lost)
            raise PeerLost(f"rank {rank}: {self.name}: centre shard owner {gone} lost before "
                           f"the elastic round: {lost[gone]}", rank=gone,
                           operation="elastic averaging round")
        asked = []
        for k, (b, segs) in enumerate(zip(self._packed(), self._segs)):
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
            self._packed().buckets[k].flat[lo:hi] -= reply

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

    # ------------------------------------------------------------------ sharded: server
    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self._serve_pending():
                lost = self._host().lost_peers()
                self._next_source(self._req_comm, [j for j in self._next_request
                                                   if j not in self._dropped
                                                   and j not in lost])

    def _serve_pending(self) -> bool:
        served = False
        alpha = self.alpha
        for src, pos in self._next_request.items():
            while (src not in self._dropped and not self._host().lost_peers().get(src)
                   and self._req_comm.probe(src)):
                k = self._served_buckets[pos]
                req = self._requests[k]
                try:
                    with self._tolerate(f"request from rank {src}") as attempt:
                        self._req_comm.recv(src, req, timeout=self.timeout)
                except GossipError as exc:
                    log.warning("rank %d: elastic averaging: bad request from rank %d: %s",
                                self._host().rank, src, exc)
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
                                        "%d failed: %s", self._host().rank, self._backup, exc)
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
                raise ProtocolError(f"rank {self._host().rank}: centre shard owner {pred} "
                                    f"forwarded an update of bucket {k}, which has no "
                                    "segment of it (elastic averaging backup)")
            d = self._from_pred[k]
            self._bak_comm.recv(pred, d, timeout=self.timeout)
        except (ProtocolError, *PEER_FAILURES) as exc:
            log.warning("rank %d: elastic averaging: backup of rank %d's shard stops: %s",
                        self._host().rank, pred, exc)
            return False
        self._replica[k] += d
        return True

    # ------------------------------------------------------------------ centre access
    @property
    def center(self) -> list:
        """The centre variable this peer holds, one flat buffer per bucket (replicated: the
        whole centre; sharded: this peer's segment of each bucket). Live; do not modify."""
        self._check_ready()
        return list(self._center)

    def load_center(self) -> None:
        """Copy the centre into the parameters (e.g. to evaluate it). Replicated: local.
        Sharded: a collective (an allreduce assembles the shards), every peer must call it.
        The workers then restart from the centre."""
        self._check_ready()
        buckets = self._packed()
        if self.center_mode == "replicated":
            for b, c in zip(buckets, self._center):
                adapter_for(c).copy(b.flat, c)
        else:
            rank = self._host().rank
            for b, segs, c in zip(buckets, self._segs, self._center):
                lo, hi = segs[rank]
                b.flat[:] = 0
                with self._lock:
                    adapter_for(c).copy(b.flat[lo:hi], c)
                self._host().allreduce(b.flat, op="sum", timeout=self.timeout)
        buckets.copy_out()

    # ------------------------------------------------------------------ membership
    @property
    def hands_off_at_leave(self) -> bool:
        """A sharded centre's leaver hands its shards over at a boundary the group agrees on
        (planned, as push-sum's mass); the replicated centre needs nothing handed over."""
        return self.center_mode == "sharded"

    def _who(self) -> str:
        return f"rank {self._host().rank} ({self._host().transport.endpoints.get('tcp', '?')})"

    # ------------------------------------------------------------------ membership: old view
    def view_changing(self, switch: Switch) -> None:
        super().view_changing(switch)
        if self.center_mode != "sharded":
            return
        self._plan, self._held = None, {}
        me, mine = switch.transport.rank, self._layout_rank
        plan = None if self._layout is None else reshard_plan(
            self._layout, switch.view, switch.handoffs, self._backups_kept())
        if plan is not None and plan["providers"][mine] != me:
            # Not going on as itself (a member left out that joins again): like a joiner, it
            # takes the plan with the source's state.
            plan = None
        if plan is not None:
            self._wait_for_leavers(switch.handoffs)
        self._halt()   # the threads hold the old view's communicators
        if plan is None:
            return
        self._plan = plan
        n, providers = plan["n"], plan["providers"]
        handed = {old: new for new, old in switch.handoffs}
        for s in range(n):
            if providers[s] != me:
                continue
            if s == mine:
                self._held[s] = list(self._center)
            elif handed.get(s) == me and self._take_handoff(s, n):
                pass
            elif self._backing and s == self._pred:
                self._drain_forwards()
                self._held[s] = list(self._replica)
            else:   # a handoff that failed, without a replica: the nearest estimate here
                log.warning("%s: elastic averaging: old segment %d of the centre did not "
                            "arrive: this worker's copy of it stands in", self._who(), s)
                self._rebuilt += 1
                self._held[s] = [adapter_for(b.flat).clone(b.flat[slice(*segment(
                    b.numel, s, n))]) for b in self._packed()]

    def _wait_for_leavers(self, handoffs: list) -> None:
        """Until each planned leaver of ``handoffs`` says it is at its boundary: a leaver is
        no member of the view committed, so the others may reach the boundary and get here
        while it still takes its last rounds, which need their servers (still running)."""
        comm = self._host().channel(PeerChannel.HANDOFF)
        for _, leaver in handoffs:
            try:
                comm.recv(leaver, np.zeros(1), timeout=self.timeout)
            except PEER_FAILURES as exc:
                log.warning("%s: elastic averaging: planned leaver rank %d did not reach its "
                            "boundary (%s)", self._who(), leaver, exc)

    def _backups_kept(self) -> bool:
        return bool(self.elastic)

    def _drain_forwards(self) -> None:
        """The updates the (dead or leaving) predecessor forwarded that are still queued, into
        the replica: each one it applied and sent before it went."""
        pred, taken = self._pred, 0
        while self._bak_comm.probe(pred):
            if not self._take_forward():
                break
            taken += 1
        if taken:
            log.info("%s: elastic averaging: %d forwarded updates of rank %d's shard taken at "
                     "the view change", self._who(), taken, pred)

    def _take_handoff(self, leaver: int, n: int) -> bool:
        """(The member a planned leave names.) Rank ``leaver``'s shards, bucket by bucket, on
        the old view's transport, then an acknowledgement. False if they did not all come."""
        comm = self._host().channel(PeerChannel.HANDOFF)
        got = []
        try:
            for b in self._packed():
                lo, hi = segment(b.numel, leaver, n)
                buf = b.new(numel=hi - lo)
                if hi > lo:
                    comm.recv(leaver, buf, timeout=self.timeout)
                got.append(buf)
            comm.send(leaver, np.ones(1), timeout=self.timeout)
        except PEER_FAILURES as exc:
            log.warning("%s: elastic averaging: rank %d's centre shards did not all arrive "
                        "(%s)", self._who(), leaver, exc)
            return False
        self._held[leaver] = got
        return True

    def hand_off(self, to: int) -> None:
        """A planned leaver at its boundary: its shards to rank ``to`` of the view it leaves."""
        super().hand_off(to)
        if self.center_mode != "sharded":
            return
        self._halt()
        if to < 0:
            log.warning("%s: elastic averaging: nobody takes its centre shards (a leave in a "
                        "recovery): they come from its backup, or are rebuilt", self._who())
            return
        comm = self._host().channel(PeerChannel.HANDOFF)
        me = self._host().rank
        for j in range(self._host().world_size):   # its rounds are done: they may stop serving
            if j != me:
                try:
                    comm.send(j, np.ones(1), timeout=self.timeout)
                except PEER_FAILURES as exc:
                    log.warning("%s: elastic averaging: rank %d did not hear it is at its "
                                "boundary (%s)", self._who(), j, exc)
        try:
            for c in self._center:
                if c.shape[0]:
                    comm.send(to, c, timeout=self.timeout)
            comm.recv(to, np.zeros(1), timeout=self.timeout)
        except PEER_FAILURES as exc:
            log.warning("%s: elastic averaging: handing its centre shards to rank %d failed "
                        "(%s)", self._who(), to, exc)
            return
        log.info("%s: elastic averaging: handed its centre shards to rank %d", self._who(), to)

    # ------------------------------------------------------------------ membership: state sent
    def _plan_state(self, state: dict) -> bool:
        """(Loading a source's state.) Take its plan if it sent one; True if it did."""
        if "reshard" not in state:
            return False
        self._plan = check_plan(state["reshard"], self._host().world_size, self._who())
        self._held = {}
        return True

    # ------------------------------------------------------------------ membership: new view
    def settle_view(self) -> None:
        super().settle_view()
        if self.center_mode != "sharded":
            return
        plan = self._plan
        if plan is None:
            raise ProtocolError(f"{self._who()}: elastic averaging: no re-shard plan for view "
                                f"of {self._host().world_size} members (the source's policy "
                                "has no sharded centre?)")
        peer, buckets = self._host(), self._packed()
        n_old, providers, keepers = plan["n"], plan["providers"], plan["keepers"]
        lost = [s for s in range(n_old) if providers[s] < 0]
        if lost:
            log.warning("%s: elastic averaging: old centre segments %s have neither owner nor "
                        "backup: rebuilt as the mean of %d workers' copies", self._who(), lost,
                        len(keepers))
            buckets.copy_in()
        centres = [self._assemble(k, b, n_old, providers, keepers, lost)
                   for k, b in enumerate(buckets)]
        self._lay_out(centres, start=True)
        self._plan, self._held = None, {}
        self._reshards += 1
        self._rebuilt += len(lost)

    def _assemble(self, k: int, b: Any, n_old: int, providers: list, keepers: list,
                  lost: list) -> Any:
        """Bucket ``k``'s whole centre: every provided old segment by an allgather, the lost
        ones by an allreduce of the keepers' worker copies."""
        peer, rank = self._host(), self._host().rank
        old = [segment(b.numel, s, n_old) for s in range(n_old)]
        ours = [s for s in range(n_old) if providers[s] == rank]
        part = b.new(numel=sum(old[s][1] - old[s][0] for s in ours))
        offset = 0
        for s in ours:
            size = old[s][1] - old[s][0]
            adapter_for(part).copy(part[offset:offset + size], self._held[s][k])
            offset += size
        gathered = peer.allgather(part, variable=True, timeout=self.timeout)
        full = b.new()
        adapter = adapter_for(full)
        for j, theirs in enumerate(gathered):
            segs = [old[s] for s in range(n_old) if providers[s] == j]
            if adapter_for(theirs).size(theirs) != sum(hi - lo for lo, hi in segs):
                raise ProtocolError(
                    f"{self._who()}: elastic averaging: rank {j} provided "
                    f"{adapter_for(theirs).size(theirs)} elements of bucket {k}'s centre, the "
                    f"plan {sum(hi - lo for lo, hi in segs)} (a layout that differs: a change "
                    "failed part-way on some members)")
            offset = 0
            for lo, hi in segs:
                adapter.copy(full[lo:hi], theirs[offset:offset + hi - lo])
                offset += hi - lo
        if lost:
            mean = b.new()
            mean[:] = 0
            if rank in keepers:
                for s in lost:
                    adapter.copy(mean[slice(*old[s])], b.flat[slice(*old[s])])
            peer.allreduce(mean, op="sum", timeout=self.timeout)
            adapter.scale(mean, 1.0 / max(1, len(keepers)))
            for s in lost:
                adapter.copy(full[slice(*old[s])], mean[slice(*old[s])])
        return full

    def view_changed(self) -> None:
        # A fixed alpha that was stable for the old n may not be for the new one.
        if self.center_mode == "replicated":
            try:
                self._check_stability()
            except ValueError as exc:
                log.warning("rank %d: elastic averaging after the view change: %s",
                            self._host().rank, exc)
        super().view_changed()

    # ------------------------------------------------------------------ state and stats
    def _extra_state(self) -> dict:
        if self._plan is not None:
            # The source of a view change: its joiners take their shards from the members
            # by this plan (the module docstring), not this member's shard.
            return {"reshard": self._plan, "center_mode": self.center_mode,
                    "alpha": self.alpha}
        with self._lock:
            return {"center": [adapter_for(c).clone(c) for c in self._center],
                    "center_mode": self.center_mode, "alpha": self.alpha}

    def _load_extra_state(self, state: dict) -> None:
        center = state.get("center")
        if state.get("center_mode") != self.center_mode:
            raise ValueError(f"state dict has center={state.get('center_mode')!r}, this policy "
                             f"center={self.center_mode!r}")
        if self.center_mode == "sharded" and self._plan_state(state):
            return
        if not isinstance(center, (list, tuple)) or len(center) != len(self._center):
            raise ValueError(f"elastic state needs {len(self._center)} centre buffers, got "
                             f"{type(center).__name__}")
        for mine, theirs in zip(self._center, center):
            if tuple(mine.shape) != tuple(theirs.shape):
                raise ValueError(f"centre buffer of shape {tuple(theirs.shape)} does not fit "
                                 f"{tuple(mine.shape)}")
        with self._lock:
            for mine, theirs in zip(self._center, center):
                adapter_for(mine).copy(mine, theirs)

    def _extra_stats(self) -> dict:
        return {"alpha": self.alpha, "beta": self.beta, "period": self.period,
                "center": self.center_mode, "elastic_rounds": self._rounds,
                "elastic": self.elastic, "min_peers": self.min_peers,
                "requests_served": self._served, "dropped_peers": sorted(self._dropped),
                "backup_forwards": self._forwards, "reshards": self._reshards,
                "segments_rebuilt": self._rebuilt}

