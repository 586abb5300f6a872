"""The coordinator's side of the view-change protocol (changes.py describes it): admitting
joiners, proposing the next view, gathering the members' answers, committing. Whichever member
is the coordinator of the moment runs it, in its door's thread, under the protocol's lock.

A live member's identity is never given to another process. A joiner under the name of a
member of the current view (a restarted process, or one started by hand with a member's
slot) is that member's restart only once the member is gone: this process counts it lost
(its transport saw it die, or another member said so), or its door refuses a connection
(nothing listens at its port: the process is gone; Door.knock), or its door does not answer a
``probe`` within PROBE_SECONDS (capped at a quarter of the protocol's timeout); meanwhile the
joiner hears ``checking``. A member that answers makes the join refused, naming it (name,
incarnation, door and host). A member replaced although alive (silent past the probe, then
back: a stopped process, a partition) is told ``replaced`` when the view without it is
committed, or when it asks for a recovery, and stops with MemberReplaced (changes.py).
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from collectives.group.proposal import Proposal
from collectives.group.view import Member, View, ViewError
from collectives.notices import LongWait

__all__ = ["Coordinator", "MAX_DONORS", "SHARING", "PROBE_SECONDS"]

#: The most members a receiver takes its state from at once (identical replicas only):
#: more would split each donor's share thinner than the links need.
MAX_DONORS = 4
#: What a member's ready says of its state (MemberProcess.sharing): the others' exactly, in
#: part, or its own.
SHARING = ("identical", "shared", "own")

#: Seconds a member's door has to answer a probe before a joiner under its name may take
#: its place (at most a quarter of the protocol's timeout): a live door answers within its
#: poll (0.1 s); a dead process's never does.
PROBE_SECONDS = 3.0

log = logging.getLogger("collectives")


@dataclass(frozen=True)
class _Probe:
    """A joiner under a current member's name, waiting while that member's door is asked
    whether it lives."""
    joiner: Member
    reply_to: str       # the joiner's door
    holder: Member      # the current view's member of that name
    asked: float        # time.monotonic() of the probe
    deadline: float


class Coordinator:
    """The coordinating state of one process's ViewChanges (``changes``)."""

    def __init__(self, changes: Any) -> None:
        self.changes = changes
        self.pending: dict[str, Member] = {}     # joiners admitted, not yet in a view
        self.active: Proposal | None = None      # the proposal under way
        self.ready: dict[str, dict] = {}         # its members' answers
        self.deadline = 0.0
        self.notice: LongWait | None = None      # the active proposal's long-wait notice
        self.lost_when_proposed: set = set()   # known_lost() as the active proposal went out
        self.counter = itertools.count(1)
        self.leaving: dict[str, str] = {}        # name -> door of a member that leaves
        self.lates = 0   # boundaries of the change under way that a member was past already
        self.probing: dict[str, _Probe] = {}   # name -> a joiner waiting on a probe
        self.knocked: set[str] = set()   # ... whose holder's door refused a connection
        # name -> door of a member that leaves at the next planned boundary (its state is
        # handed to a member there: push-sum mass), not yet in a committed view
        self.departing: dict[str, str] = {}
        door = changes.door
        for kind in ("join", "late", "ready", "recover", "leave", "alive"):
            door.on(kind, getattr(self, "on_" + kind))
        door.every_poll(self.tick)

    def on_join(self, msg: dict) -> None:
        try:
            member = Member.from_wire(msg.get("member"))
        except ViewError as exc:
            self.changes.door.tell(msg["from"], "refused", reason=f"malformed join: {exc}")
            return
        with self.changes.cond:
            c = self.changes.coordinator()
            if c is None:
                return
            if c.name != self.changes.name:
                self.changes.door.tell(msg["from"], "redirect", to=c.door)
                return
            rank = self.changes.view.rank_of(member.name)
            held = self.changes.view.member(rank) if rank is not None else None
            if held is not None and held.door != member.door \
                    and member.name not in self.changes.known_lost():
                # Its name is a member's this process does not know to be gone (the same
                # door: a member left out that joins again, as its next incarnation).
                if held.incarnation >= member.incarnation:
                    self._refuse(msg["from"], member, held,
                                 "its incarnation is not older than the joiner's")
                    return
                self._probe(member, msg["from"], held)
                return
            self._admit(member, msg["from"], rank)

    def _admit(self, member: Member, reply_to: str, rank: int | None) -> None:
        """Admit ``member`` to the next view (caller holds the lock), unless the policies or
        the job's bound refuse it; ``rank``: its name's place in the current view (a
        restart), None for a new member."""
        with self.changes.cond:
            reason = self.changes.process.refusal()
            limit = self.changes.max_members
            if reason is None and rank is None and limit and member.name not in self.pending:
                # A new slot (a restart takes its old one): the job's bound counts the live
                # members and the joiners already admitted to the next view.
                view, lost = self.changes.view, self.changes.known_lost()
                size = sum(1 for m in view.members if m.name not in lost or m.name in self.pending)
                size += sum(1 for n in self.pending if view.rank_of(n) is None)
                if size >= limit:
                    reason = (f"the job has its most members already ({limit}, "
                              "GOSSIP_MAX_PEERS: gossip run --nnodes MIN:MAX)")
            if reason is not None:
                self.changes.door.tell(reply_to, "refused", reason=reason)
                return
            self.pending[member.name] = member
            log.info("%s: %s asks to join %s", self.changes.name, member,
                     self.changes.view.describe())
            self.changes.door.tell(reply_to, "pending", view=self.changes.view.to_wire())

    def _refuse(self, reply_to: str, member: Member, held: Member, why: str) -> None:
        """Refuse ``member``, a joiner under the name of ``held``, a live member."""
        reason = (f"{member.name} is a live member of {self.changes.view.describe()}: "
                  f"{held} (door {held.door}, host {held.host or '?'}) holds the name, and "
                  f"{why}; a process takes a member's name only once that member is gone "
                  "(started without RANK or GOSSIP_MEMBER_NAME, a joiner is a new member)")
        log.warning("%s: refused %s (from %s): %s", self.changes.name, member, reply_to, reason)
        self.changes.door.tell(reply_to, "refused", reason=reason)

    def _probe(self, member: Member, reply_to: str, held: Member) -> None:
        """Ask ``held``'s door whether it lives before ``member`` may take its name (caller
        holds the lock): its ``alive`` refuses the joiner, silence admits it (tick)."""
        now = time.monotonic()
        seconds = min(PROBE_SECONDS, self.changes.timeout / 4)
        self.probing[member.name] = _Probe(member, reply_to, held, now, now + seconds)
        self.knocked.discard(member.name)
        log.info("%s: %s asks to join under the name of %s, whom it does not count lost: "
                 "asking %s's door at %s whether it lives (%.3g s)", self.changes.name, member,
                 held, held, held.door, seconds)
        self.changes.door.tell(held.door, "probe", name=held.name)
        self.changes.door.tell(reply_to, "checking", holder=held.to_wire(), seconds=seconds)
        # A dead process's port refuses connections at once: no need to wait out the probe
        # (a restart would otherwise stand PROBE_SECONDS at the door whenever this process's
        # transport had not seen the death, as under a policy that never talks to it).
        threading.Thread(target=self._knock, args=(member.name, held, seconds), daemon=True,
                         name=f"gossip door knock ({held})").start()

    def _knock(self, name: str, held: Member, seconds: float) -> None:
        """(A thread of its own.) Knock at ``held``'s door: refused, the probe of the joiner
        ``name`` ends at the next tick, as the holder's restart."""
        if not self.changes.door.knock(held.door, seconds):
            return
        with self.changes.cond:
            probe = self.probing.get(name)
            if probe is not None and probe.holder == held:
                self.knocked.add(name)

    def on_alive(self, msg: dict) -> None:
        """A probed member's door answered: the joiner under its name is refused."""
        with self.changes.cond:
            probe = self.probing.get(msg.get("name"))   # type: ignore[arg-type]
            if probe is None or msg.get("inc") != probe.holder.incarnation:
                return
            del self.probing[probe.joiner.name]
            self.knocked.discard(probe.joiner.name)
            self._refuse(probe.reply_to, probe.joiner, probe.holder,
                         f"its door answered a probe within "
                         f"{time.monotonic() - probe.asked:.2f} s")

    def _probes_due(self) -> None:
        """(tick) Joiners whose probe went unanswered past its deadline, or whose name's
        holder this process now counts lost: admitted, as that member's restart."""
        now, lost = time.monotonic(), self.changes.known_lost()
        for name, probe in list(self.probing.items()):
            if name in lost or name in self.knocked or now >= probe.deadline:
                del self.probing[name]
                if name in self.knocked:
                    self.knocked.discard(name)
                    log.warning("%s: %s's door at %s refused a connection (nothing listens "
                                "there) %.2f s into its probe: counted gone, %s takes its "
                                "place", self.changes.name, probe.holder, probe.holder.door,
                                now - probe.asked, probe.joiner)
                elif name not in lost:
                    log.warning("%s: %s's door at %s did not answer a probe within %.3g s: "
                                "counted gone, %s takes its place", self.changes.name,
                                probe.holder, probe.holder.door, probe.deadline - probe.asked,
                                probe.joiner)
                self._admit(probe.joiner, probe.reply_to, self.changes.view.rank_of(name))

    def propose(self, at_step: int | None, also_lost: frozenset = frozenset()) -> None:
        """Propose the next view (caller holds the lock): the live members, a restarted one in
        its old place, then the new joiners."""
        self.changes.reported_lost |= set(also_lost)
        lost = self.changes.known_lost()
        members = []
        for m in self.changes.view.members:
            if m.name in self.pending:
                members.append(self.pending[m.name])
            elif m.name not in lost and m.name not in self.departing:
                members.append(m)
        names = {m.name for m in members}
        members += [m for n, m in self.pending.items() if n not in names]
        number = self.changes.view.number + 1
        p = Proposal(f"{number}.{next(self.counter)}", number, tuple(members), at_step,
                     self.changes.door.address)
        self.active, self.ready, self.lost_when_proposed = p, {}, lost
        now = time.monotonic()
        self.deadline = now + self.changes.timeout / 2
        when = "at once" if at_step is None else f"at step {at_step}"
        self.notice = LongWait(lambda: f"{self.changes.name}: coordinating view {p.number} "
                                       f"({when}): waiting for the answers of "
                                       f"{[m.name for m in p.members if m.name not in self.ready]}",
                               now, now + self.changes.timeout)
        log.info("%s: proposes view %d at step %s (lost: %s): %s", self.changes.name,
                 p.number, "now" if at_step is None else at_step, sorted(lost),
                 [str(m) for m in members])
        for m in members:
            self.changes.door.tell(m.door, "prepare", **p.to_wire())
        for name, door in self.departing.items():   # they learn the boundary they leave at
            self.changes.door.tell(door, "prepare", **p.to_wire())

    def on_late(self, msg: dict) -> None:
        with self.changes.cond:
            p = self.active
            if p is None or msg.get("pid") != p.pid or p.at_step is None:
                return
            step = msg.get("step")
            if type(step) is int and step >= p.at_step:
                # Each time further on: steps too short for the margin outran it once.
                self.lates += 1
                self.propose(step + self.changes.margin.steps() * 2 ** min(self.lates, 8))

    def on_recover(self, msg: dict) -> None:
        log.info("%s: recovery asked by %s (lost: %s)", self.changes.name, msg.get("name"),
                 msg.get("lost"))
        lost = msg.get("lost")
        lost = frozenset(x for x in lost if isinstance(x, str)) if isinstance(lost, list) \
            else frozenset()
        with self.changes.cond:
            view = self.changes.view
            if view is None:
                return
            name = msg.get("name")
            if isinstance(name, str) and view.rank_of(name) is None and name not in self.pending:
                # A member the group went on without (counted lost while alive): its view is
                # stale, and so is whom it counts lost. It may join again (LeftOut).
                self.changes.door.tell(msg["from"], "left", number=view.number)
                return
            holder = view.member(view.rank_of(name)) if isinstance(name, str) \
                and view.rank_of(name) is not None else None
            if holder is not None and holder.door != msg["from"] \
                    and type(msg.get("inc")) is int and msg["inc"] != holder.incarnation:
                # Its name is another process's now (its restart took its place): it stops.
                self.changes.door.tell(msg["from"], "replaced", name=name, inc=msg["inc"],
                                       by=holder.to_wire(), number=view.number)
                return
            self.changes.reported_lost |= lost - {self.changes.name}
            if not self.changes.is_coordinator():
                return   # the sender asks the one it counts as coordinator after a deadline
            p = self.active
            if p is not None and p.at_step is None and not (lost & {m.name for m in p.members}):
                return   # the recovery under way already leaves those out
            self.propose(None, lost)

    def on_leave(self, msg: dict) -> None:
        name = msg.get("name")
        with self.changes.cond:
            view = self.changes.view
            if view is None or not isinstance(name, str) or view.rank_of(name) is None:
                return
            if not self.changes.is_coordinator() and name != self.changes.name:
                return   # the leaver asks the next one after a deadline
            if msg.get("planned") is True:
                # At the coordinator's next boundary, like a joiner (the leaver takes
                # rounds until then): see changes.py on planned leaves.
                self.departing[name] = msg["from"]
                log.info("%s: %s leaves %s at the next boundary", self.changes.name, name,
                         view.describe())
                return
            self.departing.pop(name, None)
            self.leaving[name] = msg["from"]
            log.info("%s: %s leaves %s", self.changes.name, name, view.describe())
            self.propose(None, frozenset({name}))

    def on_ready(self, msg: dict) -> None:
        with self.changes.cond:
            p = self.active
            if p is None or msg.get("pid") != p.pid:
                return
            name, entry, step = msg.get("name"), msg.get("entry"), msg.get("step")
            if not isinstance(name, str) or p.rank_of(name) is None or \
                    not isinstance(entry, dict) or type(step) is not int:
                return
            sharing = msg.get("sharing")
            self.ready[name] = {"entry": entry, "step": step,
                                "sharing": sharing if sharing in SHARING else "own",
                                "pending": msg.get("pending") is True}
            if len(self.ready) == len(p.members):
                self._commit_active()

    def _commit_active(self) -> None:
        p = self.active
        if p is None:
            return
        ranks = range(len(p.members))
        old = self.changes.view.names()
        # The state everyone continues from: the old member that completed most steps.
        olds = [r for r in ranks if p.members[r].name in old
                and p.members[r].incarnation == self.changes.view.member(
                    self.changes.view.rank_of(p.members[r].name)).incarnation]
        steps = {r: self.ready[p.members[r].name]["step"] for r in ranks}
        source = max(olds, key=lambda r: (steps[r], -r)) if olds else 0
        step = steps[source]
        sharing = {self.ready[m.name]["sharing"] for m in p.members}
        replicated = sharing == {"identical"}   # several donors: their states are the same
        resync = sharing <= {"identical", "shared"}   # those behind the source take its state
        receivers = [r for r in ranks if r not in olds or resync and steps[r] != step]
        # Identical replicas at the source's step can all send it: each a share of the
        # chunks, the source first (it alone sends the manifest the receivers check all by).
        donors = [source]
        if replicated and receivers:
            donors += [r for r in olds if r != source and steps[r] == step][:MAX_DONORS - 1]
        view = View(self.changes.view.job_id, p.number, p.members,
                    step if p.at_step is None else p.at_step)
        table = {str(r): self.ready[p.members[r].name]["entry"] for r in ranks}
        handoffs = self._handoffs(p, olds) if p.at_step is not None else {}
        # The source's state holds its update of step ``step``, not yet combined: those that
        # take it complete that step in the new view (changes.py).
        completes = self.ready[p.members[source].name]["pending"]
        names = {m.name for m in p.members}
        left = sorted(name for name in (*self.leaving, *self.departing) if name not in names)
        commit = {"pid": p.pid, "view": view.to_wire(), "table": table, "source": source,
                  "step": step, "receivers": receivers, "donors": donors,
                  "completes": completes, "left": left,
                  "handoffs": [[new, self.changes.view.rank_of(name)]
                               for name, (new, _) in handoffs.items()]}
        for m in p.members:
            self.changes.door.tell(m.door, "commit", **commit)
        self._tell_replaced(p)
        for m in p.members:
            self.pending.pop(m.name, None)
        for name, door in list(self.leaving.items()):
            if name not in {m.name for m in p.members}:
                self.changes.door.tell(door, "left", number=p.number)
                del self.leaving[name]
        for name, door in list(self.departing.items()):
            if name not in {m.name for m in p.members}:
                to = handoffs[name][1] if name in handoffs else -1
                self.changes.door.tell(door, "left", number=p.number, to=to)
                del self.departing[name]
        self.active = None
        self.lates = 0
        log.info("%s: committed %s (state from ranks %s at step %d%s to ranks %s)",
                 self.changes.name, view.describe(), donors, step,
                 ", its update not yet combined" if completes else "", receivers)

    def _tell_replaced(self, p: Proposal) -> None:
        """Members of the current view whose name the committed view gives to another
        process (a restart: the old one is dead, or was silent past a probe): tell the old
        one, which, if it lives after all, stops instead of training on alone."""
        view = self.changes.view
        for m in p.members:
            rank = view.rank_of(m.name)
            old = view.member(rank) if rank is not None else None
            if old is not None and old.door != m.door:
                self.changes.door.tell(old.door, "replaced", name=old.name,
                                       inc=old.incarnation, by=m.to_wire(), number=p.number)

    def _handoffs(self, p: Proposal, olds: list[int]) -> dict[str, tuple[int, int]]:
        """Each planned leaver of the current view -> (new rank, old rank) of the member that
        takes its state: the next member after it, in the old rank order, that goes on in
        the proposed view as itself (it reads the leaver on the old view's transport)."""
        view = self.changes.view
        staying = {p.members[r].name: r for r in olds}
        out = {}
        for name in self.departing:
            leaver = view.rank_of(name)
            if leaver is None or name in staying:
                continue
            for k in range(1, len(view)):
                candidate = view.member((leaver + k) % len(view)).name
                if candidate in staying:
                    out[name] = (staying[candidate], (leaver + k) % len(view))
                    break
        return out

    def tick(self) -> None:
        """Door thread: a proposal some members have not answered. A silent member is left
        out only once this process counts it lost (its transport saw it die, or another
        member said so); one that is merely slow is asked again at the deadline, never
        dropped for slowness, or two coordinators could commit two different views. A loss
        learnt after the proposal went out (it was made as the member died: a peer that
        read a dead process's memory knows first) leaves the member out at once, not at the
        deadline (15 s); one known before, or a member admitted again (pending), may be a
        restarted member's old self, and the new process, under the same name, has until
        the deadline to answer."""
        with self.changes.cond:
            if self.probing:
                self._probes_due()
            p = self.active
            if p is None:
                return
            late = time.monotonic() >= self.deadline
            silent = [m.name for m in p.members if m.name not in self.ready]
            if not silent:
                return
            if self.notice is not None:
                self.notice.check()
            lost = self.changes.known_lost()
            if late:
                lost |= self._joiners_silent(p, silent)
            else:   # (a joiner or restarted process in this proposal: pending, not lost)
                lost -= self.lost_when_proposed | set(self.pending)
            gone = [name for name in silent if name in lost]
            if not gone:
                if not late:
                    return
                self.deadline = time.monotonic() + self.changes.timeout / 4
                log.info("%s: view %d's proposal waits for %s: asking again", self.changes.name,
                         p.number, silent)
                for m in p.members:
                    if m.name in silent:
                        self.changes.door.tell(m.door, "prepare", **p.to_wire())
                return
            log.warning("%s: no answer to view %d's proposal from %s, counted lost: "
                        "proposing without them", self.changes.name, p.number, gone)
            for name in gone:
                self.pending.pop(name, None)
            self.propose(p.at_step, frozenset(gone))

    def _joiners_silent(self, p: Proposal, silent: list[str]) -> set:
        """Joiners (not members of the current view) that did not answer: no transport of
        ours watches them, so their silence past the deadline is all there is to go by."""
        members = set(self.changes.view.names())
        return {name for name in silent if name not in members}
