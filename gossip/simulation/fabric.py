"""The in-process network of a simulation: what the peers of one process send each other, and
the virtual clock each of them keeps.

Data moves at once, in memory; time does not. Each peer has a clock (seconds of simulated
time). A message leaves at its sender's clock, waits for its directed link to be free, and
arrives ``latency + bytes / rate`` later (that link's: links.py); the receiver's clock moves to
the arrival if that is later. A collective starts when its last member arrives (the latest
clock) and ends after the algorithm's cost on the link model (the ring allreduce's 2(n - 1)
steps of bytes / n, ...); every member's clock moves to the end. Results are combined in rank
order, so a simulation gives the same numbers whatever order its threads run in.

Deaths and restarts follow ``churn`` (churn.py: each slot's lives, a death ending each, a
request to join beginning each later one). A peer dies at the first point it reaches at or
after its life's death (a step's start, a neighbour exchange's start, or after an exchange's
receives, before it combines them): it sends nothing more and absorbs nothing that arrives
from then on (a message arriving at or after a peer's death is not delivered: the sender
learns it). The others count it lost ``detect`` seconds after its death (the heartbeat
timeout), as their clocks pass that; a receive from it that finds nothing waits (in real
time) until it is dead, then moves the receiver's clock to that detection and raises PeerLost.
Messages carry their exchange's number, so a round one peer skipped is never taken for the
next. Everything here follows the clocks and the schedule, never the threads' real order.

Views (a recovery at once, sim_host.SimHost.recover: an elastic policy's after a death, any
policy's after a leave at once): peers keep the number they
started with (their global rank: clocks, counts and messages use it); ``members`` lists the
current view's, in its rank order. A collective is among the view's members; one whose
member died raises PeerLost on every survivor, its clock moved to the death's detection.
The survivors then meet in ``reform``: once every member of the old view arrived, died, left
or ended its training, the view becomes those who arrived (the others left out, the
survivors renumbered in their order), every survivor's clock moves to the last arrival plus
a barrier's cost over the new view (the agreement on it), and collectives count again from
the first. The commit is the coordinator's (collectives/group/coordinator.py): everyone goes
on from the step count of the survivor furthest on, whose state those behind take when the
policy's replicas are identical or share a part (local SGD).

Restarts (a later life's request to join): while one may come, the members meet at every step
boundary (``boundary``; every member
arrives or dies). At the first boundary whose latest clock is at or after the request, and
once the old process is dead, the view becomes the live members and the restarted ones,
ordered by their starting ranks (the dead left out); the lowest surviving member is the
source, whose state (its policy's Snapshot) the joiner takes (``post_state``,
``take_state``); everyone's clock moves to the boundary's latest clock plus the state's
transfer (bytes / rate and a latency, from the source to each joiner in turn) plus a barrier
over the new view. The restarted peer counts as alive again from then on, until its new life's
death (a slot may die and come back any number of times). A new peer (a slot past the
churn's ``initial``, which no process held before) joins the same way.

Leaves (``leaves``: rank -> the simulated second it asks to leave) are at once
(``leave_at_once``, every policy but push-sum, as ``peer.leave()``): the members of the
leaver's view hear of it a barrier's latencies over the view after its request (``notice``,
known from the schedule as the view begins, so that whether a member heard depends on its own
clock only, never on how far the leaver's thread got); from then on each starts no operation of
that view, an operation waiting on a member gone or already re-forming ends (ViewChanging, its
clock at the notice), and they re-form (``reform``). The leaver goes (``depart``) at its own
first boundary at or after its request, or as it hears of its own change, whichever comes
first. While restarts are pending too, a change at once comes first: a step boundary whose
latest clock is past the view's notice, or with a member already re-forming (who counts as
having come), admits nobody; its members hear of the change there and re-form, and the restart
is admitted at a boundary of the next view. Planned leaves (push-sum's) take effect the way
restarts do, at the first boundary whose latest clock is at or after the request: the view goes
on without the leaver, which hands what its policy holds (push-sum's mass) to the next staying
member after it (over the policies' channels, free of time) and ends.

Scheduled runs (``scheduled``: the asynchronous policy's threads, scheduler.py) wait in
virtual time: a meeting, an admission or a transfer releases the lock and is looked at again
as the fabric changes (_wait, _notify); a peer waiting there takes no death until it is over.
Their policies' timed channels belong to a view each, and a receive from a dead or departed
peer fails as the others hear of it.
"""
from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from collectives.transport.emulation import LinkSpec
from gossip.errors import OperationTimeout, PeerLost, ViewChanging
from gossip.simulation.churn import Churn
from gossip.simulation.links import Links
from gossip.simulation.scheduler import Scheduler

__all__ = ["Fabric", "Admission", "collective_seconds", "SimulatedDeath"]


class SimulatedDeath(BaseException):
    """Raised in a simulated peer's thread when its scheduled death comes (a BaseException,
    as a killed process is not an error the policy may catch)."""


def collective_seconds(op: str, nbytes: int, size: int, link: LinkSpec | None) -> float:
    """Simulated seconds of collective ``op`` over ``size`` peers on ``nbytes`` per peer when
    every link is ``link``, by the algorithm the collectives run: allreduce by recursive
    doubling below DEFAULT_SMALL_BYTES (ceil(log2 n) steps of nbytes), as a ring above (2(n-1)
    steps of nbytes/n); allgather as a ring (n-1 steps of nbytes); broadcast as a binomial tree
    (ceil(log2 n) steps of nbytes); barrier as ceil(log2 n) latencies. 0 without a link model
    or for one peer. (Links.collective_seconds: the same over links that differ.)"""
    if link is None or size <= 1:
        return 0.0
    return Links.uniform(size, link).collective_seconds(op, nbytes)


class Admission:
    """A view change at a step boundary that admits restarted peers: the new view's members
    (starting ranks, in rank order), the step count everyone goes on from, the source's and the
    joiners' ranks in it, and the source's state once posted."""

    def __init__(self, number: int, members: list[int], step: int, source: int,
                 receivers: list[int], start: float, *,
                 leavers: dict[int, int] | None = None, completes: bool = False) -> None:
        self.number = number
        # (A recovery's.) The source's state holds its update of ``step``, not yet combined.
        self.completes = completes
        self.members = members
        # Planned leavers (starting ranks) -> the starting rank of the member taking their state.
        self.leavers = dict(leavers or {})
        self.step = step
        self.source = source
        self.receivers = receivers
        self.start = start                 # the boundary's latest clock
        self.state: Any = None             # the source's Snapshot
        self.loaded = 0                    # joiners that took it
        self.end: float | None = None      # after the transfer and the barrier


class _Round:
    __slots__ = ("parts", "clocks", "result", "end", "taken")

    def __init__(self) -> None:
        self.parts: dict[int, Any] = {}
        self.clocks: dict[int, float] = {}
        self.result: Any = None
        self.end: float | None = None
        self.taken = 0


class Fabric:
    """``size`` peers' mailboxes, collectives and clocks (one lock; waits bounded by
    ``timeout`` real seconds, then OperationTimeout naming the peers waited for). ``links``:
    every directed link (links.py), or one LinkSpec for all, or None (free)."""

    def __init__(self, size: int, links: Links | LinkSpec | None = None, *,
                 timeout: float = 300.0, churn: Churn | None = None, detect: float = 2.0,
                 leaves: dict[int, float] | None = None, leave_at_once: bool = False,
                 scheduled: bool = False) -> None:
        self.size = size
        self.links = links if isinstance(links, Links) else Links.uniform(size, links)
        self.churn = churn if churn is not None else Churn(size)
        if self.churn.slots != size:
            raise ValueError(f"the churn's {self.churn.slots} slots are not the fabric's {size}")
        self.detect = detect
        # Each slot's life now (churn.py): the one whose process runs, or last ran; -1 for a
        # slot whose first process has not joined yet.
        self._life = [self.churn.first_life(r) for r in range(size)]
        # Slots whose process is dead now (threads ended), and those no process held yet.
        self.dead: set[int] = {r for r in range(size) if self._life[r] < 0}
        # The life each slot's thread waits to see admitted once its process died (and a new
        # slot's first).
        self._awaiting = [life + 1 for life in self._life]
        self.died: list[int] = []          # every death so far, in order (a slot once a death)
        self._later = self.churn.later_lives()   # lives that begin with a request (None: no end)
        self.leaves = dict(leaves or {})       # rank -> the second it asks to leave
        self.left: list[int] = []              # leavers gone, in order
        # Leaves at once (the policy does not hand its state off at a leave): the leaver goes
        # at its own first boundary past its request, and the others hear of the change.
        self.leave_at_once = leave_at_once
        # A leaver at once -> (its clock as it left, when its view's members hear of it).
        self._departed: dict[int, tuple[float, float]] = {}
        # View number -> when its members hear of a change at once in it (a leave's notice).
        self._notices: dict[int, float] = {}
        self._admitted: list[tuple[int, int]] = []   # (slot, life) of every admission
        # Slot -> the view its present life was admitted in (a restarted or new peer's).
        self._since: dict[int, int] = {}
        # (slot, life) -> the view change that admitted that life.
        self._admissions: dict[tuple[int, int], Admission] = {}
        self._boundaries: dict[tuple[int, int], _Round] = {}   # (view, step)
        self._finished: set[int] = set()   # members whose training ended
        self._excluded: set[tuple[int, int]] = set()   # (a, b): a counts b lost
        self.timeout = timeout
        self.clock = [0.0] * size
        self.bytes_sent = [0] * size
        self.messages_sent = [0] * size
        self.link_bytes: dict[tuple[int, int], int] = {}   # (src, dst) -> bytes sent
        self._cond = threading.Condition()
        self._mail: dict[tuple[Hashable, ...], deque[tuple[Any, float, Any]]] = {}
        # (Timed channels) (channel, dst) -> the sources with a message waiting, so a wait for
        # any of many sources looks at those only.
        self._waiting_from: dict[tuple[Hashable, int], dict[int, None]] = {}
        self._link_free: dict[tuple[int, int], float] = {}
        self._rounds: dict[tuple[int, str, int], _Round] = {}   # (view, op, seq)
        self._seq: list[dict[str, int]] = [{} for _ in range(size)]
        self._aborted: str | None = None
        # The current view's peers, in its rank order.
        self.members = list(range(self.churn.initial))
        self.view_number = 0
        self._position = {m: k for k, m in enumerate(self.members)}   # member -> view rank
        self._view_links = self.links.subset(self.members)
        self._reforms: dict[int, _Round] = {}   # the view being left -> its survivors' meeting
        self._plan_notice()
        # Virtual threads (scheduler.py), one running at a time in virtual-time order: for the
        # background policies, whose threads meet on timed channels (channel_send, ...).
        self.scheduler = Scheduler(self.clock, timeout=timeout, death=self._death_at,
                                   life=lambda rank: self._life[rank]) if scheduled else None
        self._waiters: set[Any] = set()   # (scheduled) virtual threads in a wait of _wait

    def abort(self, reason: str) -> None:
        """End every wait now and every later one at once, with ``reason`` (a peer failed: the
        others would wait for it until their timeout)."""
        with self._cond:
            self._aborted = reason
            self._notify()
        if self.scheduler is not None:   # (its threads wait in virtual time: end them too)
            self.scheduler.stop(RuntimeError(f"simulation stopped: {reason}"))

    def _check(self) -> None:
        if self._aborted is not None:
            raise RuntimeError(f"simulation stopped: {self._aborted}")

    def _notify(self) -> None:
        """(Under the lock.) The fabric changed: every wait on it looks again (real threads;
        a scheduled run's virtual threads in _wait)."""
        self._cond.notify_all()
        if self.scheduler is not None:
            for thread in list(self._waiters):
                self.scheduler.recheck(thread)

    def _wait(self, predicate: Callable[[], Any], timeout: float | None, what: str) -> bool:
        """(Under the lock, a peer's own thread.) Until ``predicate()`` holds, at most
        ``timeout`` real seconds (False then). In a scheduled run, in virtual time: the other
        threads run meanwhile (the lock released), this one resumes when a change of the
        fabric makes it hold; no real deadline (a wait nobody will end is the scheduler's
        deadlock), and its peer's death is deferred (it comes at the peer's next step)."""
        if self.scheduler is None:
            return self._cond.wait_for(predicate, timeout)
        if predicate():
            return True
        scheduler = self.scheduler
        me = scheduler.running()
        self._waiters.add(me)
        self._cond.release()
        try:
            with scheduler.deferring_death(me.rank):
                return scheduler.wait_for(scheduler.holds(predicate), None, what)
        finally:
            self._cond.acquire()
            self._waiters.discard(me)

    def advance(self, rank: int, seconds: float) -> None:
        """``rank`` computes for ``seconds`` of simulated time (a step's start: it dies here
        if its time came)."""
        self.check_alive(rank)
        with self._cond:
            self.clock[rank] += seconds
        if self.scheduler is not None:   # (the threads whose time comes first run now)
            self.scheduler.sleep_until(self.clock[rank])

    # -- deaths ------------------------------------------------------------------------------
    def death_of(self, rank: int, until: float | None = None) -> float:
        """(Under the lock.) When ``rank``'s present life dies, if at or before ``until``
        (math.inf if not); without ``until``, as far as the schedule is drawn (a dead peer's
        death always is)."""
        return self.churn.death(rank, self._life[rank],
                                max(self.clock) if until is None else until)

    def _death_at(self, thread: Any) -> SimulatedDeath | None:
        """(The scheduler, as ``thread``, a virtual thread of a peer, takes its turn.) Its
        death: the peer's own thread dies at its first turn at or after its life's death (it
        enacts it: mark_dead); a policy's thread once its peer's own thread died, or once
        its life ended (a restart's process starts threads of its own), so a peer's threads
        never outlive one another's death, whatever their clocks; a peer's own thread,
        once dead, is its next life's process, waiting to be admitted."""
        rank, clock = thread.rank, thread.clock
        with self._cond:
            if not thread.main:
                if rank in self.dead or thread.life != self._life[rank]:
                    return SimulatedDeath(f"simulated rank {rank} died (its life "
                                          f"{thread.life} ended)")
                return None
            if rank in self.dead:
                return None
            when = self.death_of(rank, clock)
        return SimulatedDeath(f"simulated rank {rank} died at {when:g} s") \
            if clock >= when else None

    def life_of(self, rank: int) -> int:
        """``rank``'s present life: 0 for its first process, one more for each restart (a
        view's member incarnation)."""
        with self._cond:
            return self._life[rank]

    def check_alive(self, rank: int) -> None:
        """SimulatedDeath if ``rank``'s clock reached its death."""
        with self._cond:
            when = self.death_of(rank, self.clock[rank])
        if self.clock[rank] >= when:
            raise SimulatedDeath(f"simulated rank {rank} died at {when:g} s")

    def mark_dead(self, rank: int) -> bool:
        """``rank``'s thread ended by its death: whoever waits on it hears now. True if a later
        life of the slot asks to join (its thread waits for its admission, wait_admitted)."""
        with self._cond:
            self.dead.add(rank)
            self.died.append(rank)
            self._awaiting[rank] = self._life[rank] + 1
            self._notify()
            return self.churn.request(rank, self._life[rank] + 1) is not None

    def finished(self, rank: int) -> None:
        """``rank``'s training ended (a joiner still waiting then is never admitted)."""
        with self._cond:
            self._finished.add(rank)
            self._notify()

    def _heard(self, rank: int) -> float:
        """(Under the lock.) When the others hear that ``rank``, gone, is gone: a leaver at
        once at its view's notice, the dead ``detect`` after the death."""
        if rank in self._departed:
            return self._departed[rank][1]
        return self.death_of(rank) + self.detect

    def _plan_notice(self) -> None:
        """(Under the lock, as the current view begins.) When its members hear of a change at
        once in it: the earliest request of a leaver at once among them, plus a barrier's
        latencies over the view (the leaver's word to the coordinator, whose proposal reaches
        the members). Taken from the schedule, never from the leaver's thread, so every
        member knows from its own clock whether it heard, whatever the threads' order."""
        asked = [self.leaves[m] for m in self.members if m in self.leaves]
        if self.leave_at_once and asked:
            self._notices[self.view_number] = min(asked) + \
                self._view_links.collective_seconds("barrier", 0)

    # -- leaves at once -----------------------------------------------------------------------
    def leave_due(self, rank: int) -> bool:
        """(A member at its boundary, or hearing of the change its own request began.)
        ``rank`` leaves at once now: its request came."""
        with self._cond:
            return self.leave_at_once and rank not in self._departed and \
                self.clock[rank] >= self.leaves.get(rank, math.inf)

    def depart(self, rank: int) -> None:
        """``rank`` leaves at once, at its clock: its process ends (the others' waits on it
        end as they hear, at the view's notice), and the members re-form without it
        (reform)."""
        with self._cond:
            self._departed[rank] = (self.clock[rank], self._notices[self.view_number])
            self.left.append(rank)
            self.dead.add(rank)
            self._notify()

    def notice(self, number: int) -> float | None:
        """When the members of view ``number`` hear of a change at once in it (None: none
        came)."""
        with self._cond:
            return self._notices.get(number)

    def _reforming(self) -> dict[int, Any]:
        """(Under the lock.) The members of the current view already at its re-forming
        (reform), who take part in none of its operations any more."""
        meeting = self._reforms.get(self.view_number)
        return meeting.parts if meeting is not None else {}

    def _changing_error(self, rank: int, what: str) -> PeerLost:
        """(Under the lock.) ``rank``'s ``what`` is ended by the change at once under way
        (a member it waits for is re-forming the group): its clock moves to the notice."""
        heard = self._notices.get(self.view_number, self.clock[rank])
        self.clock[rank] = max(self.clock[rank], heard)
        return ViewChanging(f"simulated rank {rank}: {what} ended: the group is re-forming "
                            f"(view {self.view_number} changes at once)", operation=what)

    def lost_for(self, rank: int) -> dict[int, str]:
        """The peers ``rank`` counts lost at its clock (a life's death, detected ``detect``
        after it, until the slot's next life is admitted), by global rank."""
        with self._cond:
            now = self.clock[rank]
            lost = {d: f"died at {t:g} s (simulated), detected at {t + self.detect:g} s"
                    for t, d, life in self.churn.deaths_until(now - self.detect)
                    if d != rank and self._life[d] == life}
            fresh = {(rank, d) for d in lost} - self._excluded
            if fresh:
                self._excluded |= fresh
                self._notify()
        return lost

    def _gone_since(self, src: int, tag: Any) -> bool:
        """(Under the lock.) ``src``'s life that would send the message ``tag`` of an earlier
        view is over: a later life of the slot joined since (a receive of an exchange still
        in flight at a view change, push-sum's overlap flushing at a restart's boundary)."""
        return isinstance(tag, tuple) and tag[0] < self._since.get(src, -1)

    def _lost_error(self, dst: int, src: int, what: str) -> PeerLost:
        """(Under the lock.) No message ``what`` will come from ``src``: it died, or it went
        on without ``dst`` (whose own death is due: it fell that far behind). The clock of
        ``dst`` moves to the earlier of its hearing of ``src``'s death and its own death,
        both from the schedule, never from which thread got where first."""
        heard = self._heard(src)
        if math.isinf(heard) and self._life[src] > 0:   # (its life before, gone since)
            heard = self.churn.death(src, self._life[src] - 1, max(self.clock)) + self.detect
        own = self.death_of(dst, min(heard, max(self.clock)))
        self.clock[dst] = max(self.clock[dst], min(heard, own))
        why = (f"left at {self._departed[src][0]:g} s (simulated)" if src in self._departed
               else f"died at {heard - self.detect:g} s (simulated)" if heard <= own
               else "went on without this peer, whose death is due")
        return PeerLost(f"simulated rank {dst}: rank {src} {why}; no message for {what}",
                        rank=src, operation=what)

    def send(self, src: int, dst: int, data: np.ndarray, tag: Any = 0, *,
             channel: Hashable | None = None) -> bool:
        """Post a copy of ``data`` from ``src`` to ``dst`` (never blocks), numbered ``tag``
        (ordered: an int, or a host's (view, exchange) pair), or on timed ``channel``
        (scheduled runs: channel_take; a policy channel's number and the view it belongs
        to, so a view's messages are never taken by another view's receives);
        False if it arrives at or after ``dst``'s death (not delivered)."""
        copy = np.array(data, copy=True)
        key = (src, dst) if channel is None else (channel, src, dst)
        with self._cond:
            start = max(self.clock[src], self._link_free.get((src, dst), 0.0))
            rate, latency = self.links.link(src, dst)
            transfer = copy.nbytes / rate
            self._link_free[(src, dst)] = start + transfer
            arrival = start + transfer + latency
            self._count(src, dst, copy.nbytes)
            self.messages_sent[src] += 1
            delivered = arrival < self.death_of(dst, arrival)
            # Not delivered: a marker, so dst (still running, behind) dies when it looks for it.
            # A timed channel's message is kept: a thread of dst takes it only while dst runs
            # (its death deferred through a view change: sim_host._switch_to).
            self._mail.setdefault(key, deque()).append(
                (copy if delivered or channel is not None else None, arrival, tag))
            if channel is not None:
                self._waiting_from.setdefault((channel, dst), {})[src] = None
                if self.scheduler is not None:   # (a thread of dst may wait for it)
                    self.scheduler.recheck_rank(dst)
            self._notify()
            return delivered

    def recv(self, dst: int, src: int, what: str, tag: Any = 0, *,
             dying: bool = True) -> np.ndarray:
        """The message ``tag`` from ``src`` to ``dst`` (older ones, of rounds ``dst``
        skipped, are dropped); ``dst``'s clock moves to its arrival. PeerLost if ``src`` died
        or went on without ``dst`` before sending it (the module docstring). A message that
        arrives at or after ``dst``'s death ends ``dst`` (SimulatedDeath), or with
        ``dying=False`` (inside a view change, where this fabric takes no death: it comes at
        the peer's next step) is missing, PeerLost, as its sender counted it."""
        with self._cond:
            box = self._mail.setdefault((src, dst), deque())

            def ready() -> bool:
                while box and box[0][2] < tag:
                    box.popleft()
                return bool(box) or self._aborted is not None or src in self.dead \
                    or (src, dst) in self._excluded or src in self._reforming() \
                    or self._gone_since(src, tag)
            if not self._cond.wait_for(ready, self.timeout):
                raise OperationTimeout(f"simulated rank {dst}: no message from rank {src} for "
                                       f"{what} within {self.timeout:g}s (real time)")
            self._check()
            if not box or box[0][2] != tag:
                if src in self._reforming() and src not in self.dead:
                    raise self._changing_error(dst, what)
                raise self._lost_error(dst, src, what)
            data, arrival, _ = box.popleft()
            if data is None and not dying:
                raise PeerLost(f"simulated rank {dst}: {what} from rank {src} arrives after "
                               "this peer's death (not delivered)", rank=src, operation=what)
            self.clock[dst] = max(self.clock[dst], arrival)
            if data is None:   # it arrives after dst's death
                raise SimulatedDeath(f"simulated rank {dst} died at "
                                     f"{self.death_of(dst):g} s")
            return data

    # -- side channels (free of time: a policy's small control messages) --------------------
    def post(self, channel: int, src: int, dst: int, data: np.ndarray) -> None:
        with self._cond:
            self._mail.setdefault((channel, src, dst), deque()).append(
                (np.array(data, copy=True), 0.0, 0))
            self._notify()

    def take(self, channel: int, dst: int, src: int, timeout: float) -> np.ndarray:
        with self._cond:
            box = self._mail.setdefault((channel, src, dst), deque())
            if not self._cond.wait_for(lambda: bool(box) or src in self.dead
                                       or self._aborted is not None, timeout):
                raise OperationTimeout(f"simulated rank {dst}: nothing from rank {src} on "
                                       f"channel {channel} within {timeout:g}s (real time)",
                                       rank=src)
            self._check()
            if not box:
                raise PeerLost(f"simulated rank {dst}: rank {src} died", rank=src)
            return box.popleft()[0]

    # -- timed channels (scheduled runs: a background policy's threads) ----------------------
    def _arrival(self, channel: Hashable, dst: int, src: int) -> float | None:
        box = self._mail.get((channel, src, dst))
        return box[0][1] if box else None

    def channel_take(self, channel: Hashable, dst: int, src: int, timeout: float | None,
                     what: str) -> np.ndarray:
        """(A virtual thread of ``dst``.) The next message from ``src`` on ``channel``, once
        it arrived (the thread's clock moves to its arrival); PeerLost once ``src`` is dead
        and the others heard (``detect`` after its death) with nothing from it waiting, as a
        real receive from a dead peer; OperationTimeout after ``timeout`` simulated seconds
        without either."""
        scheduler = self.scheduler
        assert scheduler is not None

        def ready() -> float | None:
            arrival = self._arrival(channel, dst, src)
            if arrival is not None:
                return arrival
            return self._heard(src) if src in self.dead else None
        me = scheduler.running()
        self._waiters.add(me)   # (a death of src, mark_dead, makes it look again)
        try:
            if not scheduler.wait_for(ready, timeout, what):
                raise OperationTimeout(f"simulated rank {dst}: nothing from rank {src} for "
                                       f"{what} within {timeout:g}s (simulated)", rank=src)
        finally:
            self._waiters.discard(me)
        box = self._mail.get((channel, src, dst))
        if not box:
            why = (f"left at {self._departed[src][0]:g} s" if src in self._departed
                   else f"died at {self.death_of(src):g} s")
            raise PeerLost(f"simulated rank {dst}: {what}: rank {src} {why} (simulated)",
                           rank=src, operation=what)
        box = self._mail[(channel, src, dst)]
        data = box.popleft()[0]
        if not box:
            del self._waiting_from[(channel, dst)][src]
        return data

    def channel_probe(self, channel: Hashable, dst: int, src: int) -> bool:
        """Whether a message from ``src`` on ``channel`` arrived by ``dst``'s clock."""
        at = self._arrival(channel, dst, src)
        return at is not None and at <= self.clock[dst]

    def channel_wait_any(self, channel: Hashable, dst: int, sources: Sequence[int],
                         timeout: float | None, what: str) -> int | None:
        """(A virtual thread of ``dst``.) The source of the first message to arrive from
        ``sources`` on ``channel`` (the earliest arrival; ties: the lowest rank), waiting up
        to ``timeout`` simulated seconds; None if none came."""
        assert self.scheduler is not None

        wanted = set(sources)
        waiting = self._waiting_from.setdefault((channel, dst), {})

        def first() -> tuple[float, int] | None:
            times = [(self._mail[(channel, src, dst)][0][1], src) for src in waiting
                     if src in wanted]
            return min(times) if times else None
        if not self.scheduler.wait_for(lambda: (first() or (None,))[0], timeout, what):
            return None
        found = first()   # (again, as this thread resumes: the messages as they are now)
        return None if found is None else found[1]

    def _count(self, src: int, dst: int, nbytes: int) -> None:
        """(Under the lock.) ``nbytes`` sent from ``src`` to ``dst``: its peer's and its
        link's counts."""
        self.bytes_sent[src] += nbytes
        self.link_bytes[(src, dst)] = self.link_bytes.get((src, dst), 0) + nbytes

    def waiting(self, channel: int, dst: int, src: int) -> bool:
        with self._cond:
            return bool(self._mail.get((channel, src, dst)))

    def collective(self, rank: int, op: str, part: Any, nbytes: int,
                   combine: Callable[[Sequence[Any]], Any], *, cost: str | None = None) -> Any:
        """Every member's ``part`` of this ``op`` (the members' k-th calls of it in this view
        meet), combined once in view rank order by ``combine``; every member's clock moves to
        the latest arrival plus the op's cost (collective_seconds over the view, of the
        algorithm ``cost`` if given: a compressed allreduce's scheme, links.py). Members dead
        before they arrived (known once every member arrived or died, so the same whatever
        the threads' order): PeerLost, the clock at the first one's detection."""
        with self._cond:
            self._check()
            seq = self._seq[rank].get(op, 0)
            self._seq[rank][op] = seq + 1
            key = (self.view_number, op, seq)
            members = self.members
            meeting = self._rounds.setdefault(key, _Round())
            meeting.parts[rank] = part
            meeting.clocks[rank] = self.clock[rank]
            self._notify()   # (the last arrival may settle the others' wait)
            if len(meeting.parts) == len(members):
                meeting.result = combine([meeting.parts[r] for r in members])
                meeting.end = max(meeting.clocks.values()) + \
                    self._view_links.collective_seconds(cost or op, nbytes)
                self._notify()
            elif not self._wait(
                    lambda: meeting.end is not None or self._aborted is not None
                    or all(m in meeting.parts or m in self.dead or m in self._reforming()
                           for m in members),
                    self.timeout, f"the other members' {op} #{seq}"):
                missing = sorted(set(members) - set(meeting.parts))
                raise OperationTimeout(f"simulated rank {rank}: {op} #{seq} still waits for "
                                       f"ranks {missing[:8]} after {self.timeout:g}s (real time)")
            if meeting.end is None:
                self._check()
                gone = sorted(self.dead.intersection(members) - set(meeting.parts))
                if gone:
                    first = gone[0]
                    self.clock[rank] = max(self.clock[rank], min(self._heard(g) for g in gone))
                    how = (f"left at {self._departed[first][0]:g} s" if first in self._departed
                           else f"died at {self.death_of(first):g} s")
                    raise PeerLost(f"simulated rank {rank}: {op} #{seq}: rank {first} {how} "
                                   "(simulated)", rank=first, operation=f"{op} #{seq}")
                raise self._changing_error(rank, f"{op} #{seq}")
            assert meeting.end is not None
            self.clock[rank] = meeting.end
            for dst, sent in self._view_links.collective_sends(cost or op, nbytes,
                                                               self._position[rank]):
                self._count(rank, members[dst], sent)
            self.messages_sent[rank] += 1
            meeting.taken += 1
            if meeting.taken == len(members):
                del self._rounds[key]
            return meeting.result

    def _meet(self, meeting: _Round, rank: int, part: Any, members: list[int],
              what: str) -> None:
        """(Under the lock.) ``rank`` arrives at ``meeting`` (a view change's, decided by the
        first to see it settled) with ``part`` (its step count, ...); wait until every one of
        ``members`` arrived or died, or the meeting was decided."""
        meeting.parts[rank] = part
        meeting.clocks[rank] = self.clock[rank]
        self._notify()   # (the last arrival may settle the others' wait)

        def settled() -> bool:   # (a member that ended its training comes to none, nor one
            #                       that re-forms the group after a change at once)
            reforming = self._reforming()
            return meeting.end is not None or self._aborted is not None or all(
                m in meeting.parts or m in self.dead or m in self._finished or m in reforming
                for m in members)
        if not self._wait(settled, self.timeout, what):
            waited = sorted(set(members) - set(meeting.parts) - self.dead - self._finished
                            - set(self._reforming()))
            raise OperationTimeout(f"simulated rank {rank}: {what} still waits for ranks "
                                   f"{waited[:8]} after {self.timeout:g}s (real time)")
        self._check()

    def reform(self, rank: int, step: int, pending: bool = False,
               resync: bool = False) -> Admission:
        """(A recovery at once: an elastic policy's after a death, any policy's after a leave
        at once.) Meet the other survivors of the current view, ``rank`` at step count
        ``step`` (``pending``: its state holds its update of that step, not yet combined):
        once every member arrived, died or left, the new view is those who arrived, in the
        old order, and the commit is the coordinator's (collectives/group/coordinator.py):
        the source is the survivor that completed the most steps (the first in rank order
        among equals), everyone goes on from its step count, and with ``resync`` (the
        policy's replicas are identical, or share part of their state: local SGD's last
        average) the survivors at another step take its state (the Admission's receivers:
        post_state, take_state, settle). ``rank``'s clock moves to the last arrival plus a
        barrier's cost over the new view."""
        with self._cond:
            self._check()
            number, members = self.view_number, self.members
            if rank not in self._position:
                raise RuntimeError(f"simulated rank {rank} is not in view {number}")
            meeting = self._reforms.setdefault(number, _Round())
            self._meet(meeting, rank, (step, pending), members,
                       f"the recovery of view {number}")
            if meeting.end is None:   # the first to see it settled installs the new view
                survivors = [m for m in members if m in meeting.parts]
                steps = [meeting.parts[m][0] for m in survivors]
                source = max(range(len(survivors)), key=lambda k: (steps[k], -k))
                receivers = [k for k in range(len(survivors))
                             if resync and steps[k] != steps[source]]
                meeting.end = max(meeting.clocks.values()) + self.links.subset(
                    survivors).collective_seconds("barrier", 0)
                meeting.result = Admission(number + 1, survivors, steps[source], source,
                                           receivers, meeting.end,
                                           completes=meeting.parts[survivors[source]][1])
                self._install(survivors)
                self._notify()
            self.clock[rank] = max(self.clock[rank], meeting.end)
            meeting.taken += 1
            change = meeting.result
            if meeting.taken == len(change.members):
                del self._reforms[number]
            return change

    # -- restarts: a view change at a step boundary -----------------------------------------
    def boundary(self, rank: int, step: int) -> Admission | None:
        """``rank`` completed ``step`` steps. While a restart is pending, meet the other
        members here and return the Admission this boundary takes (None: no change). A
        change at once in this view comes first: once a member re-forms the group, or the
        boundary's latest clock is past the view's notice, the boundary admits nobody and
        every member at it hears of the change (its clock at least the notice: it re-forms
        the group next, SimHost.at_boundary); the restart waits for the next view's."""
        with self._cond:
            self._check()
            if self._later is not None and len(self._admitted) >= self._later and \
                    (self.leave_at_once or all(r in self.left for r in self.leaves)):
                return None   # (leaves at once take no boundary: depart, reform)
            number, members = self.view_number, self.members
            key = (number, step)
            meeting = self._boundaries.setdefault(key, _Round())
            self._meet(meeting, rank, step, members, f"step boundary {step}")
            if meeting.end is None:   # the first to see it settled decides, by the schedule
                now = max(meeting.clocks.values())
                meeting.end = now
                notice = self._notices.get(number)
                if notice is not None and (notice <= now or self._reforming()):
                    for m in meeting.parts:   # (they hear of it here)
                        self.clock[m] = max(self.clock[m], notice)
                    meeting.result = None
                    self._notify()
                    return self._leave_boundary(key, meeting)
                joiners = [r for r in sorted(self.dead)
                           if (self.churn.request(r, self._life[r] + 1) or math.inf) <= now]
                live = [m for m in members if m in meeting.parts]
                leavers = [] if self.leave_at_once else [
                    r for r in live if r not in self.left and self.leaves.get(r, math.inf) <= now]
                if len(leavers) == len(live):   # (the last one stays)
                    leavers = leavers[1:]
                meeting.result = self._admit(number, live, joiners, step, now, leavers) \
                    if joiners or leavers else None
                self._notify()
            return self._leave_boundary(key, meeting)

    def _leave_boundary(self, key: tuple[int, int], meeting: _Round) -> Admission | None:
        """(Under the lock.) A member takes the boundary's decision; the last forgets it."""
        meeting.taken += 1
        if meeting.taken == len(meeting.parts):
            del self._boundaries[key]
        return meeting.result

    def _admit(self, number: int, live: list[int], joiners: list[int], step: int,
               now: float, leavers: list[int]) -> Admission:
        """(Under the lock.) Install the view of ``live`` but ``leavers``, and ``joiners``;
        each leaver's state goes to the next staying member after it in the old view's
        order."""
        staying = [m for m in live if m not in leavers]
        new = sorted(staying + joiners)
        takers = {r: next(m for m in live[live.index(r) + 1:] + live if m in staying)
                  for r in leavers}
        admission = Admission(number + 1, new, step, new.index(min(staying)),
                              [new.index(r) for r in joiners], now, leavers=takers)
        self.left += leavers
        for r in joiners:
            self._life[r] += 1
            self._admitted.append((r, self._life[r]))
            self.dead.discard(r)
            self._excluded = {pair for pair in self._excluded if r not in pair}
            for box in [k for k in self._mail if r in k[-2:]]:
                del self._mail[box]
            for (_, dst), sources in list(self._waiting_from.items()):
                sources.pop(r, None)
                if dst == r:
                    sources.clear()
            for pair in [k for k in self._link_free if r in k]:
                del self._link_free[pair]
            self.clock[r] = max(self.clock[r], now)
            self._admissions[(r, self._life[r])] = admission
            self._since[r] = number + 1
        self._install(new)
        self._notify()
        return admission

    def _install(self, members: list[int]) -> None:
        """(Under the lock.) ``members`` become the next view."""
        number = self.view_number
        self.members = members
        self._position = {m: k for k, m in enumerate(members)}
        self._view_links = self.links.subset(members)
        self.view_number = number + 1
        self._plan_notice()
        for m in members:
            self._seq[m] = {}
        self._rounds = {k: v for k, v in self._rounds.items() if k[0] > number}

    @property
    def admitted(self) -> list[tuple[int, int]]:
        """Every life admitted so far, (slot, life), in order: a restart's life is 1 or more
        (a slot past the churn's ``initial``: its join's is 0)."""
        with self._cond:
            return list(self._admitted)

    def admission(self, rank: int) -> Admission | None:
        """(A restarted peer.) Wait until a boundary admits ``rank``'s next life (None: the
        members ended first, it never joins)."""
        with self._cond:
            key = (rank, self._awaiting[rank])

            def decided() -> bool:
                return key in self._admissions or self._aborted is not None or all(
                    m in self._finished or m in self.dead for m in self.members)
            # The members train meanwhile, for as long as the run takes: the wait fails only
            # if ``timeout`` real seconds pass without any clock moving.
            clocks = None
            while not self._wait(decided, self.timeout, "its admission"):
                if self.clock == clocks:
                    raise OperationTimeout(f"simulated rank {rank}: not admitted, and no peer's "
                                           f"clock moved for {self.timeout:g}s (real time)")
                clocks = list(self.clock)
            self._check()
            return self._admissions.get(key)

    def post_state(self, admission: Admission, state: Any) -> None:
        """(The source.) Its state for the joiners; counts the bytes sent to each."""
        with self._cond:
            admission.state = state
            src = admission.members[admission.source]
            for k in admission.receivers:
                self._count(src, admission.members[k], state.nbytes)
                self.messages_sent[src] += 1
            self._notify()

    def take_state(self, admission: Admission) -> Any:
        """(A joiner.) The source's state, once posted."""
        with self._cond:
            if not self._wait(lambda: admission.state is not None
                              or self._aborted is not None, self.timeout,
                              f"the state of view {admission.number}'s source"):
                raise OperationTimeout(f"the source of view {admission.number} posted no "
                                       f"state within {self.timeout:g}s (real time)")
            self._check()
            return admission.state

    def settle(self, rank: int, admission: Admission, *, loaded: bool = False) -> None:
        """Every member of the new view, once it took its part (``loaded``: a joiner that
        loaded the state): wait for every joiner, then move to the switch's end (the
        state's transfer from the source to each joiner in turn, then a barrier over the
        new view)."""
        with self._cond:
            if loaded:
                admission.loaded += 1
                self._notify()
            if not self._wait(lambda: admission.loaded == len(admission.receivers)
                              or self._aborted is not None, self.timeout,
                              f"view {admission.number}'s joiners to take the state"):
                raise OperationTimeout(f"simulated rank {rank}: view {admission.number}'s "
                                       f"joiners did not take the state within "
                                       f"{self.timeout:g}s (real time)")
            self._check()
            if admission.end is None:
                src = admission.members[admission.source]
                transfer, latency = 0.0, 0.0
                for k in admission.receivers:
                    rate, lat = self.links.link(src, admission.members[k])
                    transfer += admission.state.nbytes / rate
                    latency = max(latency, lat)
                admission.end = admission.start + transfer + latency + \
                    self._view_links.collective_seconds("barrier", 0)
            self.clock[rank] = max(self.clock[rank], admission.end)

    def view_rank(self, rank: int) -> int:
        """``rank``'s rank in the current view."""
        return self._position[rank]
