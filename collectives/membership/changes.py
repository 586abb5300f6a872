"""The view-change protocol: how the members of view v agree on view v + 1, at one step
boundary, without a fixed leader.

Roles. The *coordinator* of a view is its lowest-ranked member that this member does not know
to be lost; if it dies, the next one is, so no member is special for long. Every message goes
door to door (door.py); every wait has a deadline.

A planned change (a process asks to join, or a restarted one comes back):

1. The joiner tells any member's door ``join``; a member that is not the coordinator answers
   ``redirect`` (to the coordinator); the coordinator checks it and answers ``pending``.
2. At its next step boundary the coordinator proposes: ``prepare`` {pid, the new members in
   rank order, at_step S = its step + margin} to every proposed member (joiners too). The
   members keep training to boundary S (a member already past S answers ``late`` with its
   step, and the coordinator proposes again, further on).
3. At boundary S each member stops, makes its transport for the new view (rank = its place in
   the proposal) and answers ``ready`` {pid, its endpoints, its step, whom it knows lost}.
4. With every ``ready`` in, the coordinator tells everyone ``commit`` {pid, the view, the
   endpoint table, whose state the joiners take}: each member installs the new transport,
   and the old one is closed. A member that never answers by the deadline is left out and the
   others are asked again (same S: they are stopped there already).

An unplanned change (a synchronous member sees a peer die in a step, with elastic=True):
the member stops at once and tells the coordinator ``recover`` {its step, whom it knows lost};
the coordinator proposes at once (at_step None) the members it did not hear are lost, and the
rest is steps 3-4. The commit names as ``source`` the member that completed the most steps
(the step some finished and others did not is thus skipped identically everywhere: everyone
takes the source's state). A member that was stopped at a planned S when the recovery came
takes part in the recovery instead.

Joiners are processes with a door and no view yet (``view`` None here): they wait for
``prepare`` and ``commit`` like stopped members.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from collectives.errors import OperationTimeout, PeerLost, RendezvousError
from collectives.membership.door import Door
from collectives.membership.view import Member, View, ViewError

__all__ = ["ViewChanges", "Proposal", "Switch"]

log = logging.getLogger("collectives")


@dataclass(frozen=True)
class Proposal:
    pid: str
    number: int                 # the view number it proposes
    members: tuple[Member, ...]
    at_step: int | None         # None: at once (a recovery)
    coordinator: str            # its door

    def rank_of(self, name: str) -> int | None:
        for rank, m in enumerate(self.members):
            if m.name == name:
                return rank
        return None

    def to_wire(self) -> dict:
        return {"pid": self.pid, "number": self.number, "at": self.at_step,
                "members": [m.to_wire() for m in self.members]}


@dataclass
class Switch:
    """A committed change, as this process takes it: the new view, this process's transport
    for it (endpoints installed), whose state the receivers take and at which step."""
    view: View
    transport: Any
    source: int                 # rank (in the new view) whose state the receivers take
    step: int                   # the step count everyone continues from
    receivers: list[int]        # ranks that must take the source's state


class ViewChanges:
    """One process's side of the protocol. ``make_transport(rank, size, view_number)`` makes
    the transport of a proposed view (not yet connected); ``lost()`` says which members of
    the current view this process knows are lost (names)."""

    def __init__(self, name: str, incarnation: int, door: Door, view: View | None,
                 make_transport: Callable[[int, int, int], Any], lost: Callable[[], set],
                 timeout: float, margin: int = 4, host: str = "") -> None:
        self.name, self.incarnation, self.door = name, incarnation, door
        self.me = Member(name, incarnation, door.address, host)
        self.view = view
        self._make_transport = make_transport
        self._lost = lost
        self.timeout = timeout
        self.margin = margin
        self._cond = threading.Condition()
        self._proposal: Proposal | None = None     # the latest prepare heard
        self._commit: dict | None = None           # the latest commit heard
        self._answer: dict | None = None           # a joiner's latest pending/redirect/refused
        # Coordinator's state (door thread, under the condition's lock).
        self._pending: dict[str, Member] = {}
        # Members of the current view reported lost by others (a recovery request) or left
        # out for silence: this process counts them lost too, until the next view.
        self._reported_lost: set[str] = set()
        self._active: Proposal | None = None
        self._ready: dict[str, dict] = {}
        self._deadline = 0.0
        self._counter = itertools.count(1)
        for kind in ("join", "prepare", "late", "ready", "commit", "recover", "pending",
                     "redirect", "refused"):
            door.on(kind, getattr(self, "_on_" + kind))
        door.every_poll(self._tick)

    # ------------------------------------------------------------------ who coordinates
    def known_lost(self) -> set:
        """Names of the current view's members this process counts as lost."""
        return set(self._lost()) | self._reported_lost

    def coordinator(self) -> Member | None:
        """The lowest-ranked member of the current view not known lost (None for a joiner)."""
        if self.view is None:
            return None
        lost = self.known_lost()
        for m in self.view.members:
            if m.name not in lost:
                return m
        return None

    def _is_coordinator(self) -> bool:
        c = self.coordinator()
        return c is not None and c.name == self.name

    # ------------------------------------------------------------------ member side
    def has_pending(self) -> bool:
        """True when a change concerns this member at a coming boundary (cheap)."""
        return self._proposal is not None or bool(self._pending)

    def boundary(self, step: int) -> Switch | None:
        """Called by the member at every step boundary (``step``: steps completed). Returns
        the committed switch when this boundary is where a change takes effect."""
        with self._cond:
            if self._pending and self._active is None and self._is_coordinator():
                self._propose(step + self.margin)
            p = self._proposal
        if p is None or p.at_step is None or step < p.at_step:
            return None
        if step > p.at_step:   # the door thread told the coordinator; wait for its new plan
            self.door.tell(p.coordinator, "late", pid=p.pid, step=step)
            return self._stopped(step)
        return self._stopped(step)

    def recover(self, step: int, lost: set) -> Switch:
        """Stop at once after a peer was lost mid-step; returns the recovery's switch. A
        coordinator that does not propose within a quarter of the timeout is counted lost
        too, and the next one is asked."""
        with self._cond:
            self._reported_lost |= set(lost)
        deadline = time.monotonic() + self.timeout
        while True:
            c = self.coordinator()
            if c is None:
                raise PeerLost(f"{self.name}: every member of {self.view.describe()} is lost")
            self.door.tell(c.door, "recover", step=step, lost=sorted(self.known_lost()),
                           name=self.name)
            wait_until = min(deadline, time.monotonic() + self.timeout / 4)
            with self._cond:
                while self._proposal is None and time.monotonic() < wait_until:
                    self._cond.wait(0.1)
                proposed = self._proposal is not None
                if not proposed and c.name != self.name:
                    log.warning("%s: coordinator %s did not answer the recovery: counted lost",
                                self.name, c)
                    self._reported_lost.add(c.name)
            if proposed:
                return self._stopped(step, recovering=True)
            if time.monotonic() >= deadline:
                raise OperationTimeout(f"{self.name}: no member coordinated the recovery "
                                       f"within {self.timeout:g}s")

    def _stopped(self, step: int, recovering: bool = False) -> Switch | None:
        """Stopped at a boundary: answer each proposal that includes this member with a fresh
        transport, until one is committed (or a proposal moves the boundary further on)."""
        deadline = time.monotonic() + self.timeout
        answered: str | None = None
        transport = None
        while True:
            with self._cond:
                p, commit = self._proposal, self._commit
                if commit is not None and p is not None and commit["pid"] == p.pid \
                        and answered == p.pid:
                    self._proposal = self._commit = None
                    return self._take(commit, p, transport)
                if p is not None and answered != p.pid:
                    if p.at_step is not None and p.at_step > step and not recovering:
                        self._close(transport)
                        return None   # moved further on: train to the new boundary
                    if p.rank_of(self.name) is None:
                        self._close(transport)
                        raise PeerLost(f"{self.name}: left out of the proposed view {p.number} "
                                       f"(its coordinator did not count it live)")
                elif time.monotonic() >= deadline:
                    self._close(transport)
                    raise OperationTimeout(
                        f"{self.name}: no view change committed within {self.timeout:g}s "
                        f"(coordinator {self._coordinator_text()}, step {step})")
                else:
                    self._cond.wait(min(0.1, max(0.0, deadline - time.monotonic())))
                    continue
            self._close(transport)
            rank = p.rank_of(self.name)
            transport = self._make_transport(rank, len(p.members), p.number)
            entry = dict(transport.endpoints)
            self.door.tell(p.coordinator, "ready", pid=p.pid, name=self.name, entry=entry,
                           step=step, lost=sorted(self.known_lost()))
            answered = p.pid

    def _take(self, commit: dict, p: Proposal, transport: Any) -> Switch:
        view = View.from_wire(commit["view"])
        table = {int(r): e for r, e in commit["table"].items()}
        transport.set_peers(table)
        self.view = view
        self._reported_lost = set()
        log.info("%s: now rank %d of %s", self.name, view.rank_of(self.name), view.describe())
        return Switch(view, transport, commit["source"], commit["step"],
                      list(commit["receivers"]))

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

    # ------------------------------------------------------------------ joiner side
    def join(self, doors: list[str]) -> Switch:
        """Ask to join the job whose members listen at ``doors`` (any one will do); returns
        the committed switch that admits this process."""
        deadline = time.monotonic() + self.timeout
        queue = list(doors)
        tried: list[str] = []
        while queue:
            address = queue.pop(0)
            tried.append(address)
            self.door.tell(address, "join", member=self.me.to_wire())
            with self._cond:
                wait_until = min(deadline, time.monotonic() + self.timeout / 4)
                while self._answer is None and self._proposal is None \
                        and time.monotonic() < wait_until:
                    self._cond.wait(0.1)
                answer, self._answer = self._answer, None
                proposed = self._proposal is not None
            if proposed or answer is not None and answer["kind"] == "pending":
                return self._stopped(0, recovering=True)
            if answer is not None and answer["kind"] == "redirect":
                queue.insert(0, str(answer["to"]))
                continue
            if answer is not None and answer["kind"] == "refused":
                raise RendezvousError(f"{self.name}: refused by the member at {address}: "
                                      f"{answer.get('reason')}")
            if time.monotonic() >= deadline:
                break
        raise RendezvousError(f"{self.name}: no member admitted it within {self.timeout:g}s "
                              f"(asked {', '.join(tried) or 'nobody'})")

    def _on_pending(self, msg: dict) -> None:
        with self._cond:
            self._answer = msg
            self._cond.notify_all()

    _on_redirect = _on_refused = _on_pending

    # ------------------------------------------------------------------ door thread: all
    def _on_prepare(self, msg: dict) -> None:
        try:
            members = tuple(Member.from_wire(m) for m in msg["members"])
            p = Proposal(str(msg["pid"]), int(msg["number"]), members,
                         None if msg.get("at") is None else int(msg["at"]), msg["from"])
        except (KeyError, TypeError, ValueError, ViewError) as exc:
            log.warning("%s: dropped a malformed prepare: %s", self.name, exc)
            return
        with self._cond:
            if self.view is not None and p.number <= self.view.number:
                return   # of a change already taken
            self._proposal = p
            self._cond.notify_all()

    def _on_commit(self, msg: dict) -> None:
        with self._cond:
            self._commit = msg
            self._cond.notify_all()

    # ------------------------------------------------------------------ door thread: coordinator
    def _on_join(self, msg: dict) -> None:
        try:
            member = Member.from_wire(msg.get("member"))
        except ViewError as exc:
            self.door.tell(msg["from"], "refused", reason=f"malformed join: {exc}")
            return
        with self._cond:
            c = self.coordinator()
            if c is None:
                return
            if c.name != self.name:
                self.door.tell(msg["from"], "redirect", to=c.door)
                return
            rank = self.view.rank_of(member.name)
            if rank is not None and self.view.member(rank).incarnation >= member.incarnation \
                    and member.name not in self.known_lost():
                self.door.tell(msg["from"], "refused",
                               reason=f"{member.name} is a live member already "
                                      f"(incarnation {self.view.member(rank).incarnation})")
                return
            self._pending[member.name] = member
            log.info("%s: %s asks to join %s", self.name, member, self.view.describe())
            self.door.tell(msg["from"], "pending", view=self.view.to_wire())

    def _propose(self, at_step: int | None, also_lost: frozenset = frozenset()) -> None:
        """Propose the next view (caller holds the lock): the live members, a restarted one in
        its old place, then the new joiners."""
        self._reported_lost |= set(also_lost)
        lost = self.known_lost()
        members = []
        for m in self.view.members:
            if m.name in self._pending:
                members.append(self._pending[m.name])
            elif m.name not in lost:
                members.append(m)
        names = {m.name for m in members}
        members += [m for n, m in self._pending.items() if n not in names]
        p = Proposal(f"{self.view.number + 1}.{next(self._counter)}", self.view.number + 1,
                     tuple(members), at_step, self.door.address)
        self._active, self._ready = p, {}
        self._deadline = time.monotonic() + self.timeout / 2
        log.info("%s: proposes view %d at step %s: %s", self.name, p.number,
                 "now" if at_step is None else at_step, [str(m) for m in members])
        for m in members:
            self.door.tell(m.door, "prepare", **p.to_wire())

    def _on_late(self, msg: dict) -> None:
        with self._cond:
            p = self._active
            if p is None or msg.get("pid") != p.pid or p.at_step is None:
                return
            step = msg.get("step")
            if type(step) is int and step >= p.at_step:
                self._propose(step + self.margin)

    def _on_recover(self, msg: dict) -> None:
        lost = msg.get("lost")
        lost = frozenset(x for x in lost if isinstance(x, str)) if isinstance(lost, list) \
            else frozenset()
        with self._cond:
            if self.view is None:
                return
            self._reported_lost |= lost - {self.name}
            if not self._is_coordinator():
                return   # the sender asks the one it counts as coordinator after a deadline
            p = self._active
            if p is not None and p.at_step is None and not (lost & {m.name for m in p.members}):
                return   # the recovery under way already leaves those out
            self._propose(None, lost)

    def _on_ready(self, msg: dict) -> None:
        with self._cond:
            p = self._active
            if p is None or msg.get("pid") != p.pid:
                return
            name, entry, step = msg.get("name"), msg.get("entry"), msg.get("step")
            if p.rank_of(name) is None or not isinstance(entry, dict) or type(step) is not int:
                return
            self._ready[name] = {"entry": entry, "step": step}
            if len(self._ready) == len(p.members):
                self._commit_active()

    def _commit_active(self) -> None:
        p = self._active
        ranks = range(len(p.members))
        old = self.view.names()
        # The state everyone continues from: the old member that completed most steps.
        olds = [r for r in ranks if p.members[r].name in old
                and p.members[r].incarnation == self.view.member(
                    self.view.rank_of(p.members[r].name)).incarnation]
        steps = {r: self._ready[p.members[r].name]["step"] for r in ranks}
        source = max(olds, key=lambda r: (steps[r], -r)) if olds else 0
        step = steps[source]
        receivers = [r for r in ranks if r not in olds or steps[r] != step]
        view = View(self.view.job_id, p.number, p.members,
                    step if p.at_step is None else p.at_step)
        table = {str(r): self._ready[p.members[r].name]["entry"] for r in ranks}
        commit = {"pid": p.pid, "view": view.to_wire(), "table": table, "source": source,
                  "step": step, "receivers": receivers}
        for m in p.members:
            self.door.tell(m.door, "commit", **commit)
        for m in p.members:
            self._pending.pop(m.name, None)
        self._active = None
        log.info("%s: committed %s (state from rank %d at step %d to ranks %s)", self.name,
                 view.describe(), source, step, receivers)

    def _tick(self) -> None:
        with self._cond:
            p = self._active
            if p is None or time.monotonic() < self._deadline:
                return
            silent = [m.name for m in p.members if m.name not in self._ready]
            log.warning("%s: no answer to view %d's proposal from %s: proposing without them",
                        self.name, p.number, silent)
            for name in silent:
                self._pending.pop(name, None)
            self._propose(p.at_step, frozenset(silent))
