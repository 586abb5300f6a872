"""The sharded EASGD centre across membership view changes: a join, a planned leave, and with
``elastic=True`` a death. A mixin of ElasticAveraging (gossip/policies/elastic_averaging.py
holds the steady state: owners, server and backup threads); the attributes it reads
(_peer, _buckets, _center, _replica, _layout, _layout_rank, _pred, _backing, ...) are
ElasticAveraging's, BackgroundPolicy's and Policy's. The replicated centre needs none of
this (every member holds all of it): each hook here does nothing for it.

The rule: the centre is one flat buffer per bucket, cut into n segments (segment s, of
collectives.arrays.segment, owned by dense rank s of the view). At every view change it is
cut again over the new view, and the assembled centre after the change is the assembled
centre before it, bitwise: its segments are copied, never summed.

At a committed switch (gossip/elastic.py take_switch):

1. ``_view_changing`` (old view's transport, every old member; the server and backup threads
   stop first, once every planned leaver said it is at its boundary: a leaver is no member
   of the committed view, so the others may reach the boundary while its last rounds still
   need their servers). Every member computes the same *plan* from the layout its shards are cut in
   (the old view's members, by name and incarnation), the new view and the commit's
   handoffs (``reshard_plan``): for each old segment, the new rank of the member that
   provides it. That is its owner if the owner goes on as itself; else the member a planned
   leaver handed it to; else, with ``elastic``, its backup (the owner's next rank, whose
   replica has every update the owner applied: it first takes what the dead owner forwarded
   and is still queued); else nobody (-1). A member named in a handoff receives the leaver's
   shard here (PeerChannel.HANDOFF), as push-sum takes a leaver's mass.
2. The switch's source sends the joiners its model as any member would (state_transfer.py),
   with the plan in place of its own shard in the policy state: the joiners cannot make the
   plan themselves (they never saw the old view).
3. ``_settle_view`` (new view's transport, every member of the new view, joiners too, after
   the state moved and before the barrier that ends the switch): one allgather per bucket
   (variable sizes) of the segments each member provides, so every member assembles the
   whole centre; each keeps its new segment (and, with ``elastic``, the replica of its new
   predecessor's), and the threads start again over the new view. A segment nobody provides
   (an owner and its backup both lost, or a death without ``elastic``) is rebuilt as the mean
   of the workers' copies of it over the members that go on (one allreduce of the bucket,
   only then), logged and counted in ``stats()["segments_rebuilt"]``: that is the one case
   in which the centre is not conserved.

A planned ``peer.leave()`` (``hands_off_at_leave``): the leaver takes rounds until the
boundary the group agrees on, then ``_hand_off`` sends its shards to the member the commit
names (its next rank that goes on). A leave that is not committed in time is a leave at once
(gossip/peer.py): its shards then come from its backup (``elastic``) or are rebuilt.

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

import logging
from typing import Any

import numpy as np

from collectives.arrays import adapter_for, segment
from gossip.channels import PeerChannel
from gossip.errors import ProtocolError
from gossip.policies.failures import PEER_FAILURES

__all__ = ["ShardedCentreMembership", "reshard_plan", "check_plan"]

log = logging.getLogger("gossip")


def reshard_plan(layout: tuple, view: Any, handoffs: list, backups: bool) -> dict:
    """The plan of a switch (see the module docstring): ``layout`` the old members as
    (name, incarnation) in old rank order, ``view`` the new View, ``handoffs`` the commit's
    (new rank of the receiver, old rank of the leaver) pairs, ``backups`` whether every
    owner's next rank holds a replica of its shard. Returns {"n": old size, "providers": the
    new rank providing each old segment or -1, "keepers": new ranks of the old members that
    go on}: the same on every member that computes it."""
    moved = {}
    for r, (name, incarnation) in enumerate(layout):
        j = view.rank_of(name)
        if j is not None and view.member(j).incarnation == incarnation:
            moved[r] = j
    handed = {old: new for new, old in handoffs}
    n = len(layout)
    providers = []
    for s in range(n):
        if s in moved:
            providers.append(moved[s])
        elif s in handed:
            providers.append(handed[s])
        elif backups and n > 1 and (s + 1) % n in moved:
            providers.append(moved[(s + 1) % n])
        else:
            providers.append(-1)
    return {"n": n, "providers": providers, "keepers": sorted(moved.values())}


def check_plan(plan: Any, size: int, who: str) -> dict:
    """``plan`` as it came in a source's state: ProtocolError naming ``who`` unless it is one
    reshard_plan could have made for a view of ``size`` members."""
    ok = isinstance(plan, dict) and type(plan.get("n")) is int and plan["n"] >= 1
    providers, keepers = (plan.get("providers"), plan.get("keepers")) if ok else (None, None)
    ok = ok and isinstance(providers, list) and len(providers) == plan["n"] \
        and all(type(p) is int and -1 <= p < size for p in providers) \
        and isinstance(keepers, list) and all(type(k) is int and 0 <= k < size
                                              for k in keepers)
    if not ok:
        raise ProtocolError(f"{who}: the sharded centre's re-shard plan in the source's state "
                            f"is malformed: {plan!r:.200}")
    return {"n": plan["n"], "providers": list(providers), "keepers": list(keepers)}


class ShardedCentreMembership:
    """ElasticAveraging's membership hooks for its sharded centre (see the module
    docstring)."""

    _plan: dict | None = None   # the re-shard of the switch under way
    _held: dict | None = None   # old segment -> its buffers (one per bucket) this member provides
    _reshards = 0
    _rebuilt = 0

    @property
    def hands_off_at_leave(self) -> bool:
        """A sharded centre's leaver hands its shards over at a boundary the group agrees on
        (planned, as push-sum's mass); the replicated centre needs nothing handed over."""
        return self.center_mode == "sharded"

    def _who(self) -> str:
        return f"rank {self._peer.rank} ({self._peer.transport.endpoints.get('tcp', '?')})"

    # ------------------------------------------------------------------ old view
    def _view_changing(self, switch: Any) -> None:
        super()._view_changing(switch)
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
                    b.numel, s, n))]) for b in self._buckets]

    def _wait_for_leavers(self, handoffs: list) -> None:
        """Until each planned leaver of ``handoffs`` says it is at its boundary: a leaver is
        no member of the view committed, so the others may reach the boundary and get here
        while it still takes its last rounds, which need their servers (still running)."""
        comm = self._peer.channel(PeerChannel.HANDOFF)
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
        comm = self._peer.channel(PeerChannel.HANDOFF)
        got = []
        try:
            for b in self._buckets:
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

    def _hand_off(self, to: int) -> None:
        """A planned leaver at its boundary: its shards to rank ``to`` of the view it leaves."""
        super()._hand_off(to)
        if self.center_mode != "sharded":
            return
        self._halt()
        if to < 0:
            log.warning("%s: elastic averaging: nobody takes its centre shards (a leave in a "
                        "recovery): they come from its backup, or are rebuilt", self._who())
            return
        comm = self._peer.channel(PeerChannel.HANDOFF)
        me = self._peer.rank
        for j in range(self._peer.world_size):   # its rounds are done: they may stop serving
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

    # ------------------------------------------------------------------ state sent
    def _plan_state(self, state: dict) -> bool:
        """(Loading a source's state.) Take its plan if it sent one; True if it did."""
        if "reshard" not in state:
            return False
        self._plan = check_plan(state["reshard"], self._peer.world_size, self._who())
        self._held = {}
        return True

    # ------------------------------------------------------------------ new view
    def _settle_view(self) -> None:
        super()._settle_view()
        if self.center_mode != "sharded":
            return
        plan = self._plan
        if plan is None:
            raise ProtocolError(f"{self._who()}: elastic averaging: no re-shard plan for view "
                                f"of {self._peer.world_size} members (the source's policy "
                                "has no sharded centre?)")
        peer, buckets = self._peer, self._buckets
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
        peer, rank = self._peer, self._peer.rank
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
