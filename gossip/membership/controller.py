"""A peer's membership controller: its door, its view of the group, and what a view change does
to the peer and its policies (collectives/group/ is the protocol; this is the peer's side).

Every peer of a group started by the rendezvous is a member of view 0: its name is its
launcher slot (``GOSSIP_MEMBER_NAME``, default ``rank<R>`` from the rank it started with, so
a restarted process under the same variables is recognised as the same member) and its
incarnation grows with every start (``GOSSIP_INCARNATION``, torchrun's restart count, else
the start time in microseconds). A process whose launcher gave it no rank (a joiner started
by hand with ``GOSSIP_JOIN`` alone) has no slot to come back to: it is named after its host
and process id, a fresh member. A joiner under a live member's name is refused, and a
restart replaces only a member that is gone (collectives/group/coordinator.py, on_join).

A committed view change (``take_switch``): the attached policies finish what they must in
the old view (``view_changing``: push-sum's exchange in flight, a planned leaver's mass), the
peer installs the new transport (the old one's messages can never reach the new one: the
view is part of every connection's routing id), a new communicator and the topology
recomputed over the new size (a ring stays a ring; its spectral gap is logged), the policies
are told (``view_changed``), the members the commit names as stale (joiners, and after a
recovery the members that did not finish the step the source finished) take the source
member's state (state_transfer.py), everybody goes on from the same step (``resume_at``:
with ``complete`` True for a member whose state holds an update of that step not yet
combined, its own cut off by a recovery or the source's that it took, so its policy
completes the step instead of beginning it again; the peer's tracked objects, an
ElasticSampler, are told which before any state is sent: ``resume_tracked``),
state spread over the members moves (``settle_view``: the sharded EASGD centre, cut again
over the new view; a joiner's too, in its take of the state), and everybody meets in a
barrier of the new view before the old transport closes (so nothing of the old view is read
as a loss in the new one, and a joiner enters at the boundary itself). A planned leaver
takes rounds until its boundary, hands its state over there (``hand_off``), and goes.
"""
from __future__ import annotations

import logging
import os
import socket
import time
from typing import Callable, Mapping

from collectives import Transport
from collectives.config import TransportConfig
from collectives.errors import LeftOut
from collectives.group import Departure, Door, Member, Switch, View, ViewChanges
from collectives.notices import events
from gossip.errors import OperationTimeout, PeerLost
from gossip.membership.contracts import MembershipHost, MembershipParticipant
from gossip.membership.state_transfer import (Prefetch, load_state, params_of, receive_state,
                                              send_state, state_of)

__all__ = ["PeerMembership", "member_identity", "MEMBER_FIELDS"]

log = logging.getLogger("gossip")

# The fields a rendezvous entry carries for membership (beside the transport's endpoints).
MEMBER_FIELDS = ("name", "inc", "door")


def member_identity(rank: int | None, env: Mapping[str, str] | None = None) -> tuple[str, int]:
    """(name, incarnation) of this process: see the module docstring. ``rank``: the
    launcher's rank (its slot), None when no launcher gave one: then, unless
    GOSSIP_MEMBER_NAME names it, a name of its own, ``<host>-<pid>``."""
    variables = os.environ if env is None else env
    name = variables.get("GOSSIP_MEMBER_NAME") or (
        f"rank{rank}" if rank is not None else f"{socket.gethostname()[:200]}-{os.getpid()}")
    for variable in ("GOSSIP_INCARNATION", "TORCHELASTIC_RESTART_COUNT"):
        value = variables.get(variable, "")
        if value.isdigit():
            # A launcher's count, made larger than any clock-made incarnation of the same
            # slot would not be: counts stay small, so they order among themselves only.
            return name, int(value)
    return name, time.time_ns() // 1000


class PeerMembership:
    """The door and the view-change protocol of one peer, the transports they make, and what
    a change does to the peer (``bind``: the Peer that owns it, a MembershipHost) and its
    policies (MembershipParticipants). It is the MemberProcess of its ViewChanges: it makes
    their transports and answers, from the attached policies, what they ask."""

    def __init__(self, name: str, incarnation: int, config: TransportConfig,
                 make_transport: Callable[[int, int, int, list[str]], Transport],
                 timeout: float, host: str = "") -> None:
        self.name, self.incarnation = name, incarnation
        self.door = Door(config, who=f"{name}#{incarnation}")
        self._make_transport = make_transport
        self._transport: Transport | None = None
        bound = os.environ.get("GOSSIP_MAX_PEERS", "")
        if bound and (not bound.isdigit() or int(bound) < 1):
            raise ValueError(f"GOSSIP_MAX_PEERS={bound!r}: expected a positive number of "
                             "members")
        self.changes = ViewChanges(name, incarnation, self.door, None, self, timeout,
                                   host=host, max_members=int(bound or 0))
        self.rendezvous_address: str | None = None
        self._rendezvous_host = ""
        self._bound: MembershipHost | None = None
        # A joiner's state, coming since its admission, until its first policy takes it.
        self._prefetch: Prefetch | None = None
        # ... and whether it holds the source's update of its step, not yet combined (a
        # joiner admitted by a recovery: Switch.completes).
        self._prefetch_completes = False
        # A joiner until its first step of its own (entering): the step count after which
        # that is, once its state came (None: not yet).
        self._entering = False
        self._entered_at: int | None = None
        self._departed = False   # a planned leave reached its boundary (_depart)
        self._view_callbacks: list[Callable[[View], None]] = []
        #: A joiner: how its state came (bytes, seconds, donors); empty otherwise.
        self.join_stats: dict[str, object] = {}
        # What the views this peer took did to the membership (stats(): the metrics read
        # them): the highest incarnation seen of each member name, and the counts.
        self._incarnations: dict[str, int] = {}
        self._view_names: dict[str, int] = {}   # the last view counted: name -> incarnation
        self._view_members: list[tuple[str, int]] = []   # ... its members in rank order
        self._changes_seen = dict.fromkeys(
            ("view_changes", "members_joined", "members_left", "member_restarts",
             "member_deaths"), 0)

    def bind(self, peer: MembershipHost, joined: Switch | None = None) -> None:
        """The Peer this controller serves (it owns it); ``joined``: the admission of a
        joiner, whose state starts coming now, while the model is built."""
        self._bound = peer
        if joined is not None:
            self._prefetch = Prefetch(peer, joined.senders, self.changes.timeout)
            self._prefetch_completes = joined.completes
            self._entering = True
            self._count_view(joined.view, first=True)

    @property
    def _peer(self) -> MembershipHost:
        if self._bound is None:
            raise RuntimeError(f"{self.name}: the membership controller serves no peer yet")
        return self._bound

    # ------------------------------------------------------------------ views
    @property
    def view(self) -> View | None:
        """The current view (None before the first)."""
        return self.changes.view

    @property
    def joining(self) -> bool:
        """True from a join until the running job's state arrived (at the first attach)."""
        return self._prefetch is not None

    @property
    def entering(self) -> bool:
        """True from a join until this peer's first step boundary of its own in the running
        job: what a script does before its training loop (its set-up) is then behind the
        members, whose state it takes, so its set-up collectives are skipped
        (gossip.broadcast_parameters)."""
        return self._entering

    def on_view_change(self, callback: Callable[[View], None]) -> None:
        """Call ``callback(view)`` after every view change, in the thread that took it."""
        self._view_callbacks.append(callback)

    def entry_fields(self) -> dict:
        """What this process adds to its rendezvous entry."""
        return {"name": self.name, "inc": self.incarnation, "door": self.door.address}

    def start(self, transport: Transport, table: dict[int, dict], job_id: str,
              rendezvous_address: str | None) -> View:
        """View 0 from the rendezvous table; rank 0 then listens at the rendezvous address,
        so a process started again the way it first started finds the running job there."""
        members = tuple(Member(str(e.get("name") or f"rank{r}"), int(e.get("inc") or 0),
                               str(e.get("door") or ""), str(e.get("host") or ""))
                        for r, e in sorted(table.items()))
        view = View(job_id, 0, members, 0)
        self.changes.view = view
        self._count_view(view, first=True)
        self._transport = transport
        self.rendezvous_address = rendezvous_address
        self.changes.margin.members = len(view)
        self.door.on_registration = self._registration
        self.door.on_held = self._announce
        self._rendezvous_host = members[0].host   # where the rendezvous address lives
        self.door.every_poll(self._hold_rendezvous)
        log.debug("%s: %s (from the rendezvous at %s)", self.name, view.describe(),
                  rendezvous_address)
        return view

    def use(self, transport: Transport) -> None:
        """The transport of the current view (after a switch)."""
        self._transport = transport
        self.changes.margin.members = transport.world_size

    def stats(self) -> dict:
        """What Peer.stats() adds: the view number and size, the door's drops and refusals,
        what the views this peer took did (``membership``: view_changes, members_joined,
        members_left, member_restarts: a name back with a higher incarnation), and a
        joiner's join_stats."""
        stats = {"view": self.view.number if self.view else None,
                 "members": len(self.view) if self.view else None,
                 "membership": dict(self._changes_seen),
                 "door": {"dropped": self.door.dropped,
                          "handshakes_refused": dict(self.door.refusals.by_reason)}}
        if self.join_stats:   # a joiner: how its state came
            stats["join"] = dict(self.join_stats)
        return stats

    def _hold_rendezvous(self) -> None:
        """Door thread: the coordinator of the moment, if on the rendezvous host, listens at
        the rendezvous address, so a process started again as it first started (rank 0's
        too) finds the running job there, whoever died."""
        address = self.rendezvous_address
        if not address or address in self.door.listening_also or self._transport is None:
            return
        if self._transport.endpoints.get("host") != self._rendezvous_host:
            return
        if self.changes.is_coordinator():
            self.door.listen_also(address)

    def _announce(self, address: str) -> None:
        """Door thread: someone else holds the rendezvous address (a restarted rank 0's
        rendezvous, waiting for peers that are running): tell it the job runs."""
        reply = self._registration({"job": self.changes.view.job_id if self.changes.view
                                    else ""})
        if reply is not None and "running" in reply:
            self.door.announce(address, reply)

    def _registration(self, registration: dict) -> dict | None:
        """A rendezvous registration reaching this door (a restarted process starting as it
        started the first time): tell it the job runs, and where the doors are."""
        view = self.changes.view
        if view is None or registration.get("job", "") != view.job_id:
            return {"refused": f"the rendezvous address is held by a running member of job "
                               f"{view.job_id if view else '?'!r}"}
        c = self.changes.coordinator()
        doors = [c.door] if c is not None else []
        doors += [m.door for m in view.members if m.door not in doors]
        return {"running": view.to_wire(), "doors": doors}

    # ------------------------------------------------------------------ MemberProcess
    # What the protocol (collectives/group/changes.py) asks of this member: the answers come
    # from the attached policies, all of which must agree to share or to keep their steps.
    def make_transport(self, rank: int, size: int, view: int, hosts: list[str]) -> Transport:
        """The transport of a proposed view (the runtime's maker: init() passed it)."""
        return self._make_transport(rank, size, view, hosts)

    def lost_names(self) -> set[str]:
        """Names of the current view's members this peer's transport found lost."""
        view, transport = self.changes.view, self._transport
        if view is None or transport is None:
            return set()
        return {view.member(r).name for r in transport.lost_ranks() if r < len(view)}

    def _participants(self) -> list[MembershipParticipant]:
        return self._bound.policies if self._bound is not None else []

    def sharing(self) -> str:
        """"identical" (replicas: the members at the source's step may all donate),
        "shared" (a part is: elastic averaging's centre), "own"; see group/coordinator.py."""
        mine = self._participants()
        if all(p.identical_replicas for p in mine):
            return "identical"
        if all(p.identical_replicas or p.shared_state for p in mine):
            return "shared"
        return "own"

    def own_steps(self) -> bool:
        """Asynchronous gossip: each member is taken at its next boundary, whatever its
        count."""
        mine = self._participants()
        return bool(mine) and all(p.own_steps for p in mine)

    def max_drift(self) -> int | None:
        """The most steps a member can be ahead of another (None: unknown; margin.py)."""
        drifts = [p.max_drift() for p in self._participants()]
        known = [d for d in drifts if d is not None]
        return max(known) if known and len(known) == len(drifts) else None

    def refusal(self) -> str | None:
        """Why this peer cannot take a view change now (None: it can)."""
        stuck = [p.name for p in self._participants() if not p.follows_view_changes]
        if stuck:
            return (f"the group runs policy {stuck[0]!r}, which does not follow membership "
                    "changes yet (synchronous, local-sgd, gossip, asynchronous, push-sum, "
                    "choco and elastic do)")
        return None

    def interrupt(self) -> None:
        """(Door thread.) A recovery is proposed while this member is not stopped: end its
        transport's waits."""
        if self._transport is not None:
            self._transport.interrupt()

    # ------------------------------------------------------------------ at a step boundary
    def at_boundary(self, policy: MembershipParticipant, step: int) -> bool:
        """After ``policy``'s step ``step``: take a view change that takes effect at this
        boundary (a switch, or this peer's planned departure). True if the view changed."""
        self.changes.passing(step)   # first: see ViewChanges._on_prepare
        if self._entering and self._entered_at is not None and step > self._entered_at:
            self._entering = False   # its first step of its own: set-up is over
        if not self.changes.has_pending():
            return False
        try:
            switch = self.changes.boundary(step)
        except LeftOut as exc:
            switch = self._join_again(exc)
        if switch is None:
            return False
        if isinstance(switch, Departure):
            self._depart(switch)
        else:
            self.take_switch(switch, policy)
        return True

    def recover(self, policy: MembershipParticipant, step: int, pending: bool = False) -> int:
        """After a peer was lost mid-step (an elastic policy): agree with the survivors on the
        next view, take the state of the one that completed most steps, and return the step
        count to go on from. ``pending``: ``policy``'s state holds this member's local update
        of step ``step``, not yet combined (a parameter-side step cut off): the policy is
        told whether to complete that step (resume_at) as the commit decides."""
        return self.take_switch(self._recovery(step, pending), policy, pending)

    def changing_now(self) -> bool:
        """True while a change at once (a recovery, a leave) is proposed to this peer."""
        return self.changes.changing_now()

    def _recovery(self, step: int, pending: bool = False) -> Switch:
        log.info("%s: recovering at step %d%s; lost in view %s: %s", self.name, step,
                 " (its update of that step not yet combined)" if pending else "",
                 self.view.number if self.view else None,
                 self._transport.lost_ranks() if self._transport is not None else {})
        try:
            return self.changes.recover(step, self.lost_names(), pending)
        except LeftOut as exc:
            return self._join_again(exc)

    def _join_again(self, exc: LeftOut) -> Switch:
        """The group went on without this live member: join it again, as the next
        incarnation of this name (it takes the state as a restarted peer does)."""
        view = self.view
        if view is None:
            raise RuntimeError(f"{self.name}: left out of a group it never had a view of")
        doors = [m.door for m in view.members if m.name != self.name]
        log.warning("%s: %s; joining again as incarnation %d", self.name, exc,
                    self.changes.incarnation + 1)
        self.changes.start_over()
        self.incarnation = self.changes.incarnation
        return self.changes.join(doors)

    def join(self, doors: list[str]) -> Switch:
        """Ask the members at ``doors`` to admit this process; the committed switch."""
        return self.changes.join(doors)

    # ------------------------------------------------------------------ a committed switch
    def take_switch(self, switch: Switch, policy: MembershipParticipant | None = None,
                    pending: bool = False) -> int:
        """Install ``switch`` (a member's view change: the module docstring has the order);
        ``policy``: the policy whose state moves (the one at whose boundary or recovery this
        happens); ``pending``: its state holds this member's update of the step in progress,
        not yet combined. Returns the step count to go on from. A member lost while the state
        moves (a joiner that dies, or refuses the state: another model) is left out by a
        recovery at once, whatever the policy: the others' state is untouched, so the group
        goes on as before."""
        peer = self._peer
        for p in peer.policies:
            p.view_changing(switch)
        if self._transport is not None:
            self._count_deaths(self._transport, switch)
        old_transport, old_comms = peer.install_transport(switch.transport)
        self.use(switch.transport)
        for p in peer.policies:
            p.view_changed()
        rank = switch.transport.rank
        received = policy is not None and rank in switch.receivers
        # Whether this member's state, once the switch is in, holds an update of step
        # switch.step not yet combined: the source's if it takes the source's state, else its
        # own (collectives/group/changes.py).
        complete = switch.completes if received else pending
        try:
            if not received:   # before a source sends them, the tracked objects' resumption
                peer.resume_tracked(complete)
            if policy is not None and switch.receivers:
                if rank in switch.senders:
                    send_state(peer, state_of(policy), switch.receivers, switch.step,
                               policy.timeout, switch.senders, params=params_of(policy))
                    if rank == switch.source:
                        policy.state_sent()   # (push-sum: the source alone gave its share)
                elif rank in switch.receivers:
                    step, snapshot = receive_state(peer, switch.senders, state_of(policy),
                                                   policy.timeout, params=params_of(policy))
                    load_state(policy, snapshot, step)
            if policy is not None:
                # One step count in the new view (a time-varying graph's phase depends on it).
                policy.resume_at(switch.step, complete=complete)
            for p in peer.policies:   # state spread over the members (the sharded EASGD centre)
                p.settle_view()
            # The barrier also waits for the donors' sends: a donor sending to a joiner that
            # died before it connected learns so only at its send's deadline, and then
            # proposes the recovery that ends everyone's waits. A member waiting here must
            # outlast that.
            transfer = policy.timeout if policy is not None and switch.receivers else 0.0
            peer.barrier(timeout=peer.timeout + transfer)
        except PeerLost as exc:
            log.warning("rank %d: a member was lost while view %d settled (%s): leaving it out",
                        peer.rank, switch.view.number, exc)
            return self.take_switch(self._recovery(switch.step, complete), policy, complete)
        finally:
            for comm in old_comms:
                comm.close(timeout=0.5)
            old_transport.close()
        self._count_view(switch.view)
        for callback in list(self._view_callbacks):
            callback(switch.view)
        return switch.step

    def _count_deaths(self, transport: Transport, switch: Switch) -> None:
        """Count the members of the view ending that ``switch``'s view leaves out or replaces
        and that died: all but those that asked to leave (the commit names them:
        ``switch.left``) and those ``transport`` had a goodbye from. Whether this peer's
        transport has seen the death yet does not matter: the view that leaves a member
        out may come first (another member saw it go), and so may its restarted process,
        back under its name with a higher incarnation."""
        old = self._view_members   # the last view counted: the one ending (rank order)
        now = {m.name: m.incarnation for m in switch.view.members}
        lost = transport.inbox.lost_ranks()
        for rank, (name, incarnation) in enumerate(old):
            if now.get(name) == incarnation:
                continue   # still a member
            why = lost.get(rank)
            if name in switch.left or why is not None and why.kind == "closed":
                continue   # it left, or said goodbye
            self._changes_seen["member_deaths"] += 1

    def _count_view(self, view: View, first: bool = False) -> None:
        """Count what ``view`` changed against the last one this peer took (``first``: the
        view it started or joined in, counted as no change): names new to the job joined,
        names gone left, a name back with a higher incarnation restarted."""
        names = {m.name: m.incarnation for m in view.members}
        seen = self._changes_seen
        if not first:
            current = self._view_names
            seen["view_changes"] += 1
            seen["members_left"] += len(set(current) - set(names))
            for name, incarnation in names.items():
                if name in current and current[name] == incarnation:
                    continue
                if incarnation > self._incarnations.get(name, incarnation):
                    seen["member_restarts"] += 1
                elif name not in current:
                    seen["members_joined"] += 1
        self._view_names = names
        self._view_members = [(m.name, m.incarnation) for m in view.members]
        for name, incarnation in names.items():
            self._incarnations[name] = max(incarnation, self._incarnations.get(name, 0))

    # ------------------------------------------------------------------ a joiner
    def attached(self, policy: MembershipParticipant) -> None:
        """A policy attached (Policy.attach, through the peer): a joiner's first one takes the
        running job's state (fetched since the admission), then meets the members at the
        boundary where they admitted it. If the state does not fit (another model) or does
        not arrive, the joiner closes at once, so the members leave it out without
        waiting."""
        fetched = self._prefetch
        if fetched is None:
            return
        self._prefetch = None
        peer = self._peer
        try:
            step, snapshot = fetched.result(peer, state_of(policy), params_of(policy))
            load_state(policy, snapshot, step)
            # Admitted by a recovery whose source was inside a step: the policy completes it
            # with the members (its next collective, after attach) instead of a step of its own.
            policy.resume_at(step, complete=self._prefetch_completes)
            # (The step it completes at attach, if owed, is not one of its own yet.)
            self._entered_at = step + int(self._prefetch_completes)
            policy.settle_view()   # with the members' (take_switch), before the barrier
            peer.barrier()
        except BaseException:
            peer.close()
            raise
        self.join_stats = {"state_bytes": fetched.nbytes, "receive_seconds": fetched.seconds,
                           "donors": fetched.donors}
        log.info("rank %d: took the state at step %d from ranks %s (%.1f MiB received in "
                 "%.3f s); training from there", peer.rank, step, fetched.donors,
                 fetched.nbytes / 2**20, fetched.seconds)

    # ------------------------------------------------------------------ leaving
    def leave(self) -> None:
        """Leave the group for good: at once (the others' operations in progress are ended
        and each policy takes the change), or, with a policy attached that hands its state
        off at a leave (push-sum), planned: this peer takes that policy's rounds (no local
        update) until the boundary the group agrees on, hands its state to a member there
        (``_depart``), then the caller closes it."""
        planned = [p for p in self._participants() if p.hands_off_at_leave]
        if not (planned and self._leave_at_boundary(planned[0])):
            self.changes.leave()

    def _leave_at_boundary(self, policy: MembershipParticipant) -> bool:
        """A planned leave: ask for it, then take ``policy``'s rounds (after_step, no local
        update) until the boundary where the others go on without this peer (at_boundary
        then calls _depart). False if that did not happen within the membership timeout:
        the caller leaves at once instead."""
        changes = self.changes
        if not changes.request_leave():
            return False   # the last member: nobody to hand anything to
        deadline = time.monotonic() + changes.timeout
        try:
            while not self._departed and time.monotonic() < deadline and not policy.closed:
                policy.after_step()
        except (PeerLost, OperationTimeout) as exc:   # no commit came (its coordinator died)
            log.warning("rank %d: its planned leave failed (%s)", self._peer.rank, exc)
        if not self._departed:
            log.warning("rank %d: its planned leave was not committed within %gs: leaving at "
                        "once", self._peer.rank, changes.timeout)
        return self._departed

    def _depart(self, departure: Departure) -> None:
        """A planned leaver at its boundary: each policy hands what it holds to the member the
        commit named (on this view's transport), then the peer is done."""
        for p in self._participants():
            p.hand_off(departure.to)
        self._departed = True
        events.info("rank %d: left; view %d goes on without it (its state went to rank %d)",
                    self._peer.rank, departure.number, departure.to)

    def close(self) -> None:
        """Close the door."""
        self.door.close()
