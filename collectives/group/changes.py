"""The view-change protocol: how the members of view v agree on view v + 1, at one step
boundary, without a fixed leader.

Roles. The *coordinator* of a view is its lowest-ranked member that this member does not know
to be lost; if it dies, the next one is, so no member is special for long. Every message goes
door to door (door.py); every wait has a deadline.

A planned change (a process asks to join, or a restarted one comes back):

1. The joiner tells any member's door ``join``; a member that is not the coordinator answers
   ``redirect`` (to the coordinator); the coordinator checks it and answers ``pending``.
2. At its next step boundary the coordinator proposes: ``prepare`` {pid, the new members in
   rank order, at_step S = its step + margin (margin.py)} to every proposed member (joiners
   too). The members keep training to boundary S (one already past S answers ``late`` with
   its step, and the coordinator proposes again, further on).
3. At boundary S each member stops, makes its transport for the new view (rank = its place in
   the proposal) and answers ``ready`` {pid, its endpoints, its step, whom it knows lost}.
4. With every ``ready`` in, the coordinator tells everyone ``commit`` {pid, the view, the
   endpoint table, whose state the joiners take}: each member installs the new transport,
   and the old one is closed. A member that never answers by the deadline is left out and the
   others are asked again (same S: they are stopped there already).

An unplanned change (a synchronous member sees a peer die in a step, with elastic=True):
the member stops at once and tells the coordinator ``recover`` {its step, whom it knows lost};
the coordinator proposes at once (at_step None) the members it did not hear are lost, and the
rest is steps 3-4. The commit names as ``source`` the member that completed the most steps;
the members behind it take its state, which holds the steps they did not complete. Each
``ready`` also says whether the member is ``pending``: stopped inside a step whose local
update its state holds, not yet combined with the others' (a parameter-side policy's step
cut off by the death); the commit's ``completes`` is the source's. The group goes on from the
source's step count S: a member that keeps its own state completes step S in the new view
if it was pending (its own update), a member that took the source's state if ``completes``
(the source's update), and every other member begins step S afresh at its boundary, so each
member's next collective is step S's and the step is applied exactly once
(gossip/policies/base/policy.py has the policies' side). A member stopped at a planned S
takes part in the recovery. Joiners
(a door and no view yet, ``view`` None) wait for ``prepare`` and ``commit`` as stopped members
do. A live member left out (counted lost) gets LeftOut, and may ask to join again as the next
incarnation of its name (start_over()).

Identities (coordinator.py): a joiner under a current member's name is admitted as that
member's restart only once the member is gone (counted lost, or its door silent to a
``probe``; the joiner hears ``checking`` meanwhile); one whose holder answers ``alive`` is
refused, naming the holder. A member whose name a committed view gave to another process
hears ``replaced`` (at the commit, or when it asks for a recovery): it stops with
MemberReplaced at its next boundary or recovery, its waits ended at once.

A leave is at once (``leave()``: the coordinator proposes the view without the leaver as for
a recovery, so the others' operations in progress are ended), or planned
(``request_leave()``, for policies whose state must not be cut mid-round: push-sum): the
coordinator proposes the view without it at its next boundary S, as for a joiner, and sends
the leaver that ``prepare`` too; the leaver takes rounds until S, and the ``commit`` names,
for each planned leaver, the member that takes its state (``handoffs``: the next member after
it in rank order that goes on); the leaver learns that member's rank with ``left`` and hands
its state to it on the old view's transport (boundary() returns a Departure), which that
member reads before it closes that transport.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol

from collectives.errors import (GossipError, LeftOut, OperationTimeout, PeerLost, ProtocolError,
                                RendezvousError)
from collectives.group.coordinator import Coordinator
from collectives.group.door import Door
from collectives.group.margin import BoundaryMargin
from collectives.group.proposal import Departure, Proposal, Switch
from collectives.group.view import Member, View, ViewError
from collectives.notices import LongWait, events
from collectives.transport import Transport

__all__ = ["ViewChanges", "MemberProcess", "Proposal", "Switch", "Departure", "MemberReplaced"]

log = logging.getLogger("collectives")


class MemberReplaced(GossipError):
    """This member's name was given to another process: the group counted it gone (its door
    silent to a probe, or its transport lost, while it was stopped or cut off) and admitted
    a restart in its place, which now holds its rank. The process must stop: training on
    alone would be a second group under one name. ``name`` and ``incarnation`` are this
    member's; ``by`` is the member that holds the name now (name, incarnation, door, host);
    ``view``: the number of the view that replaced it."""

    def __init__(self, message: str, *, name: str, incarnation: int, by: Member,
                 view: int) -> None:
        super().__init__(message)
        self.name, self.incarnation, self.by, self.view = name, incarnation, by, view


class MemberProcess(Protocol):
    """What one member's view changes ask of the process they run in (a gossip Peer's
    membership controller): its transports, whom it knows lost, and what its state is."""

    def make_transport(self, rank: int, size: int, view: int, hosts: list[str]) -> Transport:
        """The transport of a proposed view (not yet connected): this member's ``rank`` of
        ``size``, view number ``view``, each member's host by rank."""

    def lost_names(self) -> set[str]:
        """Names of the current view's members this process's transport found lost."""

    def sharing(self) -> str:
        """"identical" (replicas: the members at the source's step may all donate),
        "shared" (a part of the state is the others' too) or "own" (coordinator.py)."""

    def own_steps(self) -> bool:
        """Whether this member's step count is its own (asynchronous gossip: no member waits
        for another, so counts drift apart by thousands): it then stops at its next boundary
        after a prepare, whatever step the proposal names, and is never late. A lock-step
        policy stops at the proposed step, which every member reaches at about the same
        time (a member far behind one far ahead took 15-30 s)."""

    def max_drift(self) -> int | None:
        """The most steps a member can be ahead of another (None: unknown; margin.py)."""

    def refusal(self) -> str | None:
        """Why this process cannot take a view change now (joiners are refused with it);
        None: it can."""

    def interrupt(self) -> None:
        """(Door thread.) A recovery is proposed while this member is not stopped at a
        boundary: end its transport's waits (it may wait on a member that stopped)."""


class ViewChanges:
    """One process's side of the protocol: a member's boundaries and recoveries, a joiner's
    admission, and its leaves (at once, or planned). ``process`` (a MemberProcess) makes the
    transports of proposed views and answers what the protocol asks of this member; ``host``:
    this process's host (which members share memory); ``max_members``: the most members a
    view may have (0: no bound)."""

    def __init__(self, name: str, incarnation: int, door: Door, view: View | None,
                 process: MemberProcess, timeout: float, *, host: str = "",
                 max_members: int = 0) -> None:
        self.name, self.incarnation, self.door = name, incarnation, door
        self.me = Member(name, incarnation, door.address, host)
        self.view = view
        self.process = process
        self.timeout = timeout
        # Steps ahead a change is proposed at (margin.py).
        self.margin = BoundaryMargin(drift=process.max_drift)
        self._boundary_step = -1   # the step of this member's latest boundary()
        self.cond = threading.Condition()
        self._proposal: Proposal | None = None     # the latest prepare heard
        self._commit: dict | None = None           # the latest commit heard
        self._answer: dict | None = None           # a joiner's latest pending/redirect/refused
        # Members of the current view reported lost by others (a recovery request) or left
        # out for silence: this process counts them lost too, until the next view.
        self.reported_lost: set[str] = set()
        for kind in ("prepare", "commit", "pending", "redirect", "refused", "left", "probe",
                     "replaced", "checking"):
            door.on(kind, getattr(self, "_on_" + kind))
        # The most members a view may have (0: no bound); joiners beyond it are refused.
        self.max_members = max_members
        self._stopped_now = False
        self.departing = False   # a planned leave was asked (request_leave)
        # The error to stop with, once a committed view gave this member's name to another
        # process (``replaced``); None while it has not.
        self.replaced: MemberReplaced | None = None
        self.coordinating = Coordinator(self)

    # ------------------------------------------------------------------ who coordinates
    def _current(self) -> View:
        """The current view: a member's (a joiner has none until its switch)."""
        if self.view is None:
            raise RuntimeError(f"{self.name}: a joiner has no view yet")
        return self.view

    def known_lost(self) -> set:
        """Names of the current view's members this process counts as lost."""
        return set(self.process.lost_names()) | self.reported_lost

    def coordinator(self) -> Member | None:
        """The lowest-ranked member of the current view not known lost (None for a joiner)."""
        if self.view is None:
            return None
        lost = self.known_lost()
        for m in self.view.members:
            if m.name not in lost:
                return m
        return None

    def is_coordinator(self) -> bool:
        c = self.coordinator()
        return c is not None and c.name == self.name

    # ------------------------------------------------------------------ member side
    def has_pending(self) -> bool:
        """True when a change concerns this member at a coming boundary (cheap)."""
        c = self.coordinating
        return self._proposal is not None or bool(c.pending) or bool(c.departing) \
            or self.replaced is not None

    def check_replaced(self) -> None:
        """Raise MemberReplaced if a committed view gave this member's name to another
        process."""
        if self.replaced is not None:
            raise self.replaced

    def passing(self, step: int) -> None:
        """At the boundary after ``step`` steps (every one, before looking: _on_prepare)."""
        self._boundary_step = step
        self.margin.passing(step)

    def boundary(self, step: int) -> Switch | Departure | None:
        """Called by the member at every step boundary (``step``: steps completed). Returns
        the committed switch when this boundary is where a change takes effect (a planned
        leaver: its Departure). MemberReplaced: another process holds this member's name."""
        self.check_replaced()
        with self.cond:
            self._boundary_step = step
            c = self.coordinating
            if (c.pending or c.departing) and c.active is None and self.is_coordinator():
                c.propose(step + self.margin.steps())
            p = self._proposal
        if p is None:
            return None
        if p.at_step is None:   # a change under way at once (a recovery, a leave): answer
            return self._stopped(step, recovering=True)
        if self.process.own_steps():    # any boundary of its own will do
            return self._stopped(step)
        if step < p.at_step:
            return None
        if step > p.at_step:   # past the boundary: the coordinator names a later one
            self.door.tell(p.coordinator, "late", pid=p.pid, step=step)
        return self._stopped(step)

    def changing_now(self) -> bool:
        """True while a change at once (a recovery, a leave) is proposed to this member: an
        operation that failed meanwhile was ended for it, not by a failure of the group.
        Also once this member was replaced (its waits were ended: recover() raises)."""
        p = self._proposal
        return p is not None and p.at_step is None or self.replaced is not None

    def recover(self, step: int, lost: set, pending: bool = False) -> Switch:
        """Stop at once after a peer was lost mid-step; returns the recovery's switch.
        ``pending``: this member's state holds its local update of the step in progress, not
        yet combined (the module docstring). A coordinator that does not propose within a
        quarter of the timeout is counted lost too, and the next one is asked."""
        self.check_replaced()
        with self.cond:
            self.reported_lost |= set(lost)
        start = time.monotonic()
        deadline = start + self.timeout
        self._ask_the_majority(step, deadline)
        notice = LongWait(lambda: f"{self.name}: recovering at step {step} (lost: "
                                  f"{', '.join(sorted(self.known_lost())) or 'none'}): waiting "
                                  f"for coordinator {self._coordinator_text()} to propose the "
                                  "next view", start, deadline)
        while True:
            self.check_replaced()
            c = self.coordinator()
            if c is None:
                raise PeerLost(f"{self.name}: every member of {self._current().describe()} is lost")
            self.door.tell(c.door, "recover", step=step, lost=sorted(self.known_lost()),
                           name=self.name, inc=self.incarnation)
            wait_until = min(deadline, time.monotonic() + self.timeout / 4)
            with self.cond:
                while self._proposal is None and self._answer is None \
                        and self.replaced is None and time.monotonic() < wait_until:
                    self.cond.wait(0.1)
                    notice.check()
            self.check_replaced()
            with self.cond:
                proposed = self._proposal is not None
                if not proposed and self._answer is not None and self._answer["kind"] == "left":
                    raise LeftOut(f"{self.name}: the group went on in view "
                                  f"{self._answer.get('number')} without it")
                if not proposed and c.name != self.name:
                    log.warning("%s: coordinator %s did not answer the recovery: counted lost",
                                self.name, c)
                    self.reported_lost.add(c.name)
            if proposed:
                return self._switched(step, pending=pending)
            if time.monotonic() >= deadline:
                raise OperationTimeout(f"{self.name}: no member coordinated the recovery "
                                       f"within {self.timeout:g}s")

    def _ask_the_majority(self, step: int, deadline: float) -> None:
        """Before a member that counts at most half of its view live coordinates a recovery
        alone (a minority: it may be the one cut off, stopped or partitioned, while the others
        went on), it asks those it counts lost whether their group went on without it: one
        that did answers ``left`` (LeftOut: join again). Silence for a quarter of the timeout:
        they are gone, and it goes on. Without this the minority would form a view of its
        own: two groups of one job."""
        live = [m for m in self._current().members if m.name not in self.known_lost()]
        if len(self._current()) < 2 or 2 * len(live) > len(self._current()):
            return
        for m in self._current().members:
            if m.name not in {x.name for x in live}:
                self.door.tell(m.door, "recover", step=step, lost=[], name=self.name,
                               inc=self.incarnation)
        wait_until = min(deadline, time.monotonic() + self.timeout / 4)
        with self.cond:
            while time.monotonic() < wait_until and self._proposal is None \
                    and self.replaced is None and not (
                    self._answer is not None and self._answer["kind"] == "left"):
                self.cond.wait(0.1)
            self.check_replaced()
            if self._answer is not None and self._answer["kind"] == "left":
                raise LeftOut(f"{self.name}: the group went on in view "
                              f"{self._answer.get('number')} without it")

    def _stopped(self, step: int, recovering: bool = False,
                 pending: bool = False) -> Switch | Departure | None:
        """Stopped at a boundary (``pending``: inside a step, its update not yet combined):
        answer each proposal that includes this member with a fresh transport, until one is
        committed (or a proposal moves the boundary further on)."""
        start = time.monotonic()
        deadline = start + self.timeout
        self._stopped_now = True
        notice = LongWait(lambda: f"{self.name}: stopped at step {step} for a view change: "
                                  f"waiting for coordinator {self._coordinator_text()} to "
                                  "commit it", start, deadline)
        try:
            return self._answer_proposals(step, recovering, pending, deadline, notice)
        finally:
            self._stopped_now = False

    def _switched(self, step: int, pending: bool = False) -> Switch:
        """_stopped for a recovery or a join (at ``step``), which go on only with a switch;
        ProtocolError for anything else (a planned leaver's departure)."""
        switch = self._stopped(step, recovering=True, pending=pending)
        if not isinstance(switch, Switch):
            raise ProtocolError(f"{self.name}: a recovery or join at step {step} ended in "
                                f"{switch!r}, not a view to go on in")
        return switch

    def _answer_proposals(self, step: int, recovering: bool, pending: bool,
                          deadline: float, notice: LongWait) -> Switch | Departure | None:
        answered: str | None = None
        transport = None
        while True:
            if self.replaced is not None:
                self._close(transport)
                raise self.replaced
            with self.cond:
                p, commit = self._proposal, self._commit
                if commit is not None and p is not None and commit["pid"] == p.pid \
                        and answered == p.pid:
                    self._proposal = self._commit = None
                    return self._take(commit, p, transport)
                if p is not None and answered != p.pid:
                    rank = p.rank_of(self.name)
                    if p.at_step is not None and p.at_step > step and not recovering \
                            and not self.process.own_steps():
                        self._close(transport)
                        return None   # moved further on: train to the new boundary
                    if rank is None and self.departing:
                        self._close(transport)
                        return self._depart(p, step, deadline)
                    if rank is None:
                        self._close(transport)
                        raise LeftOut(f"{self.name}: left out of the proposed view {p.number} "
                                      f"(its coordinator did not count it live)")
                elif time.monotonic() >= deadline:
                    self._close(transport)
                    raise OperationTimeout(
                        f"{self.name}: no view change committed within {self.timeout:g}s "
                        f"(coordinator {self._coordinator_text()}, step {step})")
                else:
                    self.cond.wait(min(0.1, max(0.0, deadline - time.monotonic())))
                    notice.check()
                    continue
            self._close(transport)
            log.debug("%s: stopped at step %d; answers coordinator %s's proposal of view %d "
                      "(%d members, this one rank %d); waits up to %.3gs for its commit",
                      self.name, step, p.coordinator, p.number, len(p.members), rank,
                      deadline - time.monotonic())
            transport = self.process.make_transport(rank, len(p.members), p.number, p.hosts)
            entry = dict(transport.endpoints)
            self.door.tell(p.coordinator, "ready", pid=p.pid, name=self.name, entry=entry,
                           step=step, lost=sorted(self.known_lost()),
                           sharing=str(self.process.sharing()), pending=bool(pending))
            answered = p.pid

    def _take(self, commit: dict, p: Proposal, transport: Any) -> Switch:
        view = View.from_wire(commit["view"])
        table = {int(r): e for r, e in commit["table"].items()}
        transport.set_peers(table)
        # Open every link of the new view now (libzmq connects and, with a key, does its CURVE
        # handshake in the background): the state a joiner takes, and the first collective,
        # then find them ready instead of waiting a handshake on the first chunk (measured:
        # a keyed 4 MiB transfer at 0.28 of point-to-point bandwidth, bound by it).
        me = view.rank_of(self.name)
        for r in table:
            if r != me:
                transport.connect(r)
        events.info("%s", _change_text(self.name, self.view, view))
        self.view = view
        self.reported_lost = set()
        source, donors = commit["source"], commit.get("donors")
        if not (isinstance(donors, list) and donors and donors[0] == source
                and all(type(r) is int and 0 <= r < len(view) for r in donors)
                and len(set(donors)) == len(donors)):
            donors = [source]   # (the coordinator always sends a sound list)
        handoffs = [(h[0], h[1]) for h in commit.get("handoffs") or ()
                    if isinstance(h, list) and len(h) == 2
                    and all(type(r) is int for r in h)]
        left = commit.get("left")
        left = frozenset(n for n in left if isinstance(n, str)) if isinstance(left, list) \
            else frozenset()
        return Switch(view, transport, source, commit["step"], list(commit["receivers"]),
                      donors, handoffs, at_once=p.at_step is None,
                      completes=commit.get("completes") is True, left=left)

    @staticmethod
    def _close(transport: Any) -> None:
        if transport is not None:
            transport.close()

    def _coordinator_text(self) -> str:
        p = self._proposal
        if p is not None:
            return p.coordinator
        c = self.coordinator()
        return c.door if c is not None else "(none)"

    # ------------------------------------------------------------------ leaving
    def leave(self) -> None:
        """Leave the group: the coordinator proposes at once the view without this member,
        which waits (at most the timeout) until that view is committed."""
        self.departing = False   # (after a planned leave that did not come through)
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            c = self.coordinator()
            others = [m for m in self._current().members if m.name != self.name
                      and m.name not in self.known_lost()]
            if c is None or not others:
                return   # the last member: nobody to tell
            self.door.tell(c.door, "leave", name=self.name)
            wait_until = min(deadline, time.monotonic() + self.timeout / 4)
            with self.cond:
                while self._answer is None and time.monotonic() < wait_until:
                    self.cond.wait(0.1)
                answer, self._answer = self._answer, None
            if answer is not None and answer["kind"] == "left":
                events.info("%s: left the group (view %s goes on without it)", self.name,
                            answer.get("number"))
                return
            if c.name != self.name:
                self.reported_lost.add(c.name)   # silent: ask the next one
        raise OperationTimeout(f"{self.name}: no coordinator confirmed its leave within "
                               f"{self.timeout:g}s")

    def request_leave(self) -> bool:
        """Ask for a planned leave (see the module docstring) and return at once: the member
        goes on taking rounds until boundary() returns its Departure. False if there is
        nobody to leave (the last live member)."""
        c = self.coordinator()
        others = [m for m in self._current().members if m.name != self.name
                  and m.name not in self.known_lost()]
        if c is None or not others:
            return False
        with self.cond:
            self.departing = True
            self._answer = None
        self.door.tell(c.door, "leave", name=self.name, planned=True)
        return True

    def _depart(self, p: Proposal, step: int, deadline: float) -> Departure | None:
        """A planned leaver at the boundary of a view without it: wait until it is committed
        (``left``, naming the member that takes this one's state), or a proposal moves the
        boundary further on (None: take rounds to it)."""
        with self.cond:
            while True:
                answer = self._answer
                if answer is not None and answer.get("kind") == "left":
                    self._answer = self._proposal = None
                    to = answer.get("to")
                    return Departure(int(answer.get("number") or 0),
                                     to if type(to) is int else -1)
                q = self._proposal
                if q is not None and q.pid != p.pid and q.at_step is not None \
                        and q.at_step > step:
                    return None
                if time.monotonic() >= deadline:
                    raise OperationTimeout(f"{self.name}: its leave was not committed within "
                                           f"{self.timeout:g}s (step {step})")
                self.cond.wait(min(0.1, max(0.0, deadline - time.monotonic())))

    # ------------------------------------------------------------------ joiner side
    def start_over(self) -> None:
        """After LeftOut: be the next incarnation of this name, to join() again (unless
        another process holds the name now: MemberReplaced)."""
        self.check_replaced()
        with self.cond:
            self.incarnation += 1
            self.me = Member(self.name, self.incarnation, self.me.door, self.me.host)
            self._proposal = self._commit = self._answer = None

    def join(self, doors: list[str]) -> Switch:
        """Ask to join the job whose members listen at ``doors`` (any one will do); returns
        the committed switch that admits this process."""
        start = time.monotonic()
        deadline = start + self.timeout
        queue = list(doors)
        tried: list[str] = []
        job = repr(self.door.config.job_id) if self.door.config.job_id else "(unnamed)"
        notice = LongWait(lambda: f"{self.name}: joining job {job}: waiting for a member to "
                                  f"admit it (asked {', '.join(tried)})", start, deadline)
        while queue or time.monotonic() < deadline:
            if not queue:
                # Nobody answered yet (the job may not have started: a joiner started before
                # its job): ask again until the deadline; a second ask is harmless (a
                # coordinator keeps one pending entry per name).
                queue = list(dict.fromkeys(doors))
            address = queue.pop(0)
            if address not in tried:
                tried.append(address)
            self.door.tell(address, "join", member=self.me.to_wire())
            with self.cond:
                wait_until = min(deadline, time.monotonic() + self.timeout / 4)
                while True:
                    while self._answer is None and self._proposal is None \
                            and time.monotonic() < wait_until:
                        self.cond.wait(0.1)
                        notice.check()
                    answer, self._answer = self._answer, None
                    if answer is None or answer["kind"] != "checking":
                        break
                    # Its name is a member's the coordinator is asking after: the answer
                    # (admitted, or refused) comes within the probe's deadline.
                    log.info("%s: the coordinator at %s checks whether %s, which holds this "
                             "name, still lives", self.name, address,
                             _member_text(answer.get("holder")))
                    wait_until = deadline
                proposed = self._proposal is not None
            if proposed or answer is not None and answer["kind"] == "pending":
                return self._switched(0)
            if answer is not None and answer["kind"] == "redirect":
                queue.insert(0, str(answer["to"]))
                continue
            if answer is not None and answer["kind"] == "refused":
                error = RendezvousError(f"{self.name}: refused by the member at {address}: "
                                        f"{answer.get('reason')}")
                log.error("%s", error)
                raise error
            if time.monotonic() >= deadline:
                break
        raise RendezvousError(f"{self.name}: no member admitted it within "
                              f"{time.monotonic() - start:.3g}s (its timeout: {self.timeout:g}s; "
                              f"asked {', '.join(tried) or 'nobody'}; is the job running "
                              "there? A process without the group's cluster key gets no "
                              "answer at all)")

    def _on_pending(self, msg: dict) -> None:
        with self.cond:
            self._answer = msg
            self.cond.notify_all()

    _on_redirect = _on_refused = _on_left = _on_checking = _on_pending

    def _on_probe(self, msg: dict) -> None:
        """A coordinator asks whether this member lives (a joiner wants its name): yes."""
        if msg.get("name") == self.name:
            self.door.tell(msg["from"], "alive", name=self.name, inc=self.incarnation)

    def _on_replaced(self, msg: dict) -> None:
        """A committed view gave this member's name to another process: stop (check_replaced
        raises at the next boundary or recovery; the transport's waits end now)."""
        if msg.get("name") != self.name or msg.get("inc") != self.incarnation:
            return   # (of an earlier incarnation of this name: a left-out member's own)
        try:
            by = Member.from_wire(msg.get("by"))
        except ViewError:
            return
        number = msg["number"] if type(msg.get("number")) is int else -1
        error = MemberReplaced(
            f"{self.name}#{self.incarnation}: replaced by {by} (door {by.door}, host "
            f"{by.host or '?'}) in view {number} of job {self.door.config.job_id or '(unnamed)'}:"
            f" the group counted this member gone (silent to a probe, or lost) and admitted a "
            "process under its name in its place; this one stops rather than train on alone",
            name=self.name, incarnation=self.incarnation, by=by, view=number)
        with self.cond:
            if self.replaced is not None:
                return
            self.replaced = error
            self.cond.notify_all()
        log.error("%s", error)
        self.process.interrupt()

    # ------------------------------------------------------------------ door thread: all
    def _on_prepare(self, msg: dict) -> None:
        try:
            members = tuple(Member.from_wire(m) for m in msg["members"])
            p = Proposal(str(msg["pid"]), int(msg["number"]), members,
                         None if msg.get("at") is None else int(msg["at"]), msg["from"])
        except (KeyError, TypeError, ValueError, ViewError) as exc:
            log.warning("%s: dropped a malformed prepare: %s", self.name, exc)
            return
        with self.cond:
            if self.view is not None and p.number <= self.view.number:
                return   # of a change already taken
            self._proposal = p
            self.cond.notify_all()
            interrupt = p.at_step is None and not self._stopped_now and self.view is not None
            # Past the proposed boundary already (steps shorter than the margin): say so now;
            # its next boundary never comes (its step's collective waits on those stopped).
            # It records its step (passing()) before it looks for a proposal, and this sets
            # the proposal before it reads the step: it sees it, or is told late here.
            late = (p.at_step is not None and self.view is not None
                    and self._boundary_step >= p.at_step and not self.process.own_steps())
            if late:
                self.door.tell(p.coordinator, "late", pid=p.pid, step=self._boundary_step + 1)
        if interrupt:
            log.info("%s: a recovery is proposed (view %d): ending this member's waits",
                     self.name, p.number)
            self.process.interrupt()

    def _on_commit(self, msg: dict) -> None:
        with self.cond:
            self._commit = msg
            self.cond.notify_all()


def _change_text(name: str, old: View | None, new: View) -> str:
    """A view change as the events log says it, once per member: the new view's number and
    members, who joined and who is gone, and this member's rank ("rank2#7: joined ...", for
    the joiner itself)."""
    me = new.rank_of(name)
    if old is None:
        return f"{name}: joined as rank {me} of {new.describe()}"
    before, after = set(old.names()), set(new.names())
    changes = []
    joined = [str(m) for m in new.members if m.name not in before or m not in old.members]
    gone = [str(m) for m in old.members if m.name not in after or m not in new.members]
    if joined:
        changes.append(f"joined {', '.join(joined)}")
    if gone:
        changes.append(f"gone {', '.join(gone)}")
    what = f" ({'; '.join(changes)})" if changes else ""
    return f"{name}: now rank {me} of {new.describe()}{what}"


def _member_text(obj: Any) -> str:
    """A member off the wire for a log line ("rank1#3 at tcp://h:p"), or "?"."""
    try:
        m = Member.from_wire(obj)
    except ViewError:
        return "?"
    return f"{m} at {m.door}"
