"""Virtual threads for the simulated peers of a background policy (asynchronous gossip): every
thread of every peer (its training loop and its policy's threads) is a real thread, but only one
runs at a time, and the next to run is always the one whose virtual time comes first, so a run
is a discrete-event simulation of the real code and two runs are the same whatever the machine.

Each thread has a clock. A thread runs until it blocks: on a lock held by another, a condition
or an event not yet set (``Concurrency``'s primitives, which a background policy takes from its
host), a message not yet arrived (the fabric's timed channels, ``wait``), or a deadline
(``sleep_until``: a step's compute, a wait's timeout). A blocked thread is ready at the time
that satisfies its wait (the message's arrival, the moment the event was set, the condition
notified, the lock released or the thread ended), or at its deadline if that comes first; the
earliest runs next (ties: the thread registered first), its clock moved to that time. The
candidates are kept in a heap: a wait's deadline goes in as the thread blocks, its readiness
as the event that satisfies it happens (``recheck``, called by the primitives and by the
fabric's timed channels for the receiving peer), so a turn costs O(log threads).
While a thread of peer r
runs, ``clocks[r]`` (the fabric's clock of r) is that thread's clock, so the fabric charges
what it sends to the right time; each thread keeps its own clock between turns.

Deaths (``death``, the fabric's): as a thread takes its turn, its peer's death may be due.
The peer's own thread raises it (its training loop ends as a killed process's), except while
its death is deferred (``deferring_death``: a view change it is in); a policy's thread gets
ThreadKilled once its peer's own thread died or its life ended (``life``: a restarted peer's
process makes threads of its own), and a thread taking a condition's lock back takes no death
until it holds it.

When no thread can ever run again while some have not ended (every one waits on something
nobody will do), the run is deadlocked: every thread raises SimulationDeadlock naming what
each waited for. A turn that does not come within ``timeout`` real seconds while no other
thread takes one raises OperationTimeout (a thread stuck outside the scheduler)."""
from __future__ import annotations

import contextlib
import heapq
import math
import threading
from collections.abc import Callable, Iterator
from typing import Any

from gossip.errors import OperationTimeout
from gossip.policies.base.concurrency import Concurrency, ThreadKilled

__all__ = ["Scheduler", "SimulationDeadlock"]

#: A blocked thread's readiness: the virtual time at which its wait is satisfied, or None.
Ready = Callable[[], "float | None"]


class SimulationDeadlock(RuntimeError):
    """Every thread of a simulation waits on something no thread will do."""


class _VThread:
    __slots__ = ("name", "rank", "seq", "clock", "ready", "deadline", "woke", "resume",
                 "done", "what", "target", "main", "epoch", "blocked", "joiners", "life",
                 "shielded")

    def __init__(self, name: str, rank: int, seq: int, clock: float,
                 target: Callable[[], None], main: bool, life: int) -> None:
        self.name, self.rank, self.seq, self.clock = name, rank, seq, clock
        self.main = main   # the peer's own thread (its training loop), not its policy's
        self.life = life   # (a policy's thread) the life of its peer's slot it belongs to
        self.shielded = False   # taking a lock back (a condition's wait): no death meanwhile
        self.ready: Ready | None = None
        self.deadline = clock        # a new thread is ready at its creator's clock
        self.woke = False
        self.resume = threading.Event()
        self.done = False
        self.what = "its start"
        self.target = target
        self.epoch = 0           # its block's number: heap entries of older blocks are void
        self.blocked = True      # waiting for its turn (a new thread: its start)
        self.joiners: list[_VThread] = []   # threads waiting for its end


class Scheduler(Concurrency):
    """The virtual threads of one simulation; ``clocks``: the fabric's, one per peer."""

    def __init__(self, clocks: list[float], *, timeout: float = 300.0,
                 death: Callable[[_VThread], BaseException | None] | None = None,
                 life: Callable[[int], int] = lambda rank: 0) -> None:
        self._clocks = clocks
        self._death = death   # a thread's death, if its peer's came by its clock
        self._life = life     # a peer's present life (a restart begins the next one)
        self._immune: dict[int, int] = {}   # rank -> deferrals of its death (deferring_death)
        self._timeout = timeout
        self._lock = threading.Lock()
        self._threads: list[_VThread] = []
        self._local = threading.local()
        self._current: _VThread | None = None
        self._failed: BaseException | None = None
        self._turns = 0
        self._all_done = threading.Event()
        # Candidates: (time, registration, 0 ready / 1 deadline, push count, epoch, thread).
        self._heap: list[tuple[float, int, int, int, int, _VThread]] = []
        self._pushes = 0
        self._by_rank: dict[int, list[_VThread]] = {}

    # -- threads -------------------------------------------------------------------------
    def spawn(self, target: Callable[[], None], rank: int, name: str, *,
              main: bool = False) -> _VThread:
        """(Before ``run``, or from a running thread.) A new thread of peer ``rank`` running
        ``target``, ready at the clock of whoever made it; ``main``: the peer's own thread."""
        clock = self._clocks[rank] if self._current is None else self._now()
        with self._lock:
            vt = _VThread(name, rank, len(self._threads), clock, target, main,
                          self._life(rank))
            self._threads.append(vt)
            self._by_rank.setdefault(rank, []).append(vt)
            self._push(clock, vt, ready=False)
        real = threading.Thread(target=self._body, args=(vt,), name=name, daemon=True)
        real.start()
        return vt

    def run(self) -> None:
        """(The caller's own thread, not a virtual one.) Run every thread to its end."""
        first = self._pick()
        if first is None:
            return
        self._hand(first[0], first[1], first[2])
        turns = -1
        while not self._all_done.wait(self._timeout):
            if self._turns == turns:
                holder = self._current.name if self._current is not None else "none"
                self._fail(OperationTimeout(
                    f"simulation: no virtual thread took a turn for {self._timeout:g}s (real "
                    f"time); {holder} holds it"))
                break
            turns = self._turns

    def _body(self, vt: _VThread) -> None:
        self._local.me = vt
        while not vt.resume.wait(self._timeout):   # (its first turn; a failure wakes it too)
            if self._failed is not None:
                break
        vt.resume.clear()
        try:
            if self._failed is None:
                if not vt.main:   # (a policy's thread started after its peer's death)
                    self._check_death(vt)
                vt.target()
        except ThreadKilled:   # (its peer died: it ends, as a killed process's thread)
            pass
        except BaseException as exc:   # the run's failure: every thread stops (run, failed)
            if exc is not self._failed:
                self._fail(exc)
        finally:
            self._end(vt, "nothing (ended)")
            if all(t.done for t in self._threads):
                self._all_done.set()
            elif self._failed is None:
                self._switch(vt, ending=True)

    def running(self) -> _VThread:
        """The virtual thread calling (RuntimeError from any other thread)."""
        vt = getattr(self._local, "me", None)
        if vt is None:
            raise RuntimeError("a simulated peer's primitive used outside its virtual threads")
        return vt

    def _now(self) -> float:
        """The running thread's clock."""
        me = self.running()
        return self._clocks[me.rank]

    # -- turns ---------------------------------------------------------------------------
    def block(self, ready: Ready | None, deadline: float, what: str) -> bool:
        """(A running thread.) Give up the turn until ``ready()`` is a time (True) or the
        clock reaches ``deadline`` (False)."""
        me = self.running()
        if self._failed is not None:
            raise self._failed
        if self._current is not me:
            holder = self._current.name if self._current is not None else "nobody"
            raise RuntimeError(f"simulation: {me.name} waits for {what} while {holder} holds "
                               "the turn (a scheduler bug: two virtual threads ran at once)")
        me.clock = self._clocks[me.rank]
        me.ready, me.deadline, me.what = ready, deadline, what
        me.epoch += 1
        me.blocked = True
        if deadline < math.inf:
            self._push(deadline, me, ready=False)
        self.recheck(me)
        self._switch(me)
        return me.woke

    def recheck(self, vt: _VThread) -> None:
        """(After an event that may satisfy ``vt``'s wait.) If it does, ``vt`` is ready at
        that time (unless its deadline comes first)."""
        if not vt.blocked or vt.done or vt.ready is None:
            return
        at = vt.ready()
        if at is not None and max(vt.clock, at) <= vt.deadline:
            self._push(max(vt.clock, at), vt, ready=True)

    def recheck_rank(self, rank: int) -> None:
        """``recheck`` every thread of peer ``rank`` (a message arrived for it)."""
        for vt in self._by_rank.get(rank, ()):
            self.recheck(vt)

    def _push(self, when: float, vt: _VThread, *, ready: bool) -> None:
        self._pushes += 1
        heapq.heappush(self._heap, (when, vt.seq, 0 if ready else 1, self._pushes, vt.epoch,
                                    vt))

    def _end(self, vt: _VThread, what: str) -> None:
        """``vt`` ended (or stopped for good): it takes no more turns; its joiners may go."""
        vt.done, vt.blocked, vt.what = True, False, what
        for joiner in vt.joiners:
            self.recheck(joiner)

    def sleep_until(self, when: float, what: str = "its compute") -> None:
        """(A running thread.) Let every thread whose time comes first run, then go on at
        ``when``."""
        self.block(None, when, what)

    def _pick(self) -> tuple[_VThread, float, bool] | None:
        """The blocked thread whose time comes first: the heap's first entry still standing
        (of the thread's present block; a readiness still holding)."""
        while self._heap:
            when, _, kind, _, epoch, vt = heapq.heappop(self._heap)
            if vt.done or not vt.blocked or vt.epoch != epoch:
                continue
            if kind == 0 and (vt.ready is None or vt.ready() is None):
                continue   # (no longer: a lock taken again first; a later event rechecks)
            return vt, when, kind == 0
        return None

    def _switch(self, me: _VThread, *, ending: bool = False) -> None:
        picked = self._pick()
        if picked is None:   # every thread left waits on what no thread will do
            error = SimulationDeadlock(self._deadlock())
            self._fail(error)
            if ending:
                return
            raise error
        nxt, when, woke = picked
        self._hand(nxt, when, woke, wake=nxt is not me)
        if ending:
            return
        if nxt is not me:
            while not me.resume.wait(self._timeout):
                if self._failed is not None:
                    break
            me.resume.clear()
        if self._failed is not None:
            raise self._failed
        self._check_death(me)

    def _check_death(self, me: _VThread) -> None:
        """(``me`` just took its turn.) If its peer's death came by its clock: the peer's own
        thread raises the death (its loop ends as a killed process's, through its
        ``finally``), a policy's thread ThreadKilled (it unwinds, on its turn, and ends
        quietly: BackgroundPolicy._guarded)."""
        if self._death is None or me.shielded or (me.main and self._immune.get(me.rank)):
            return
        error = self._death(me)
        if error is None:
            return
        if me.main:
            raise error
        raise ThreadKilled(str(error))

    @contextlib.contextmanager
    def deferring_death(self, rank: int) -> Iterator[None]:
        """Peer ``rank``'s own thread takes no death inside (a view change it is in: its
        death comes at its next turn past it, as on the other policies at the next step; its
        policy's threads die only once it did)."""
        self._immune[rank] = self._immune.get(rank, 0) + 1
        try:
            yield
        finally:
            self._immune[rank] -= 1

    def _hand(self, nxt: _VThread, when: float, woke: bool, *, wake: bool = True) -> None:
        """Give the turn to ``nxt`` at ``when`` (``wake``: resume its real thread; not when
        the thread that blocked takes the turn back itself)."""
        nxt.clock, nxt.woke = when, woke
        nxt.ready, nxt.deadline = None, math.inf
        nxt.blocked = False
        nxt.epoch += 1
        self._clocks[nxt.rank] = when
        self._current = nxt
        self._turns += 1
        if wake:
            nxt.resume.set()

    def _deadlock(self) -> str:
        waiting = [f"{vt.name} (clock {vt.clock:.6g} s) waits for {vt.what}"
                   + (f" (until {vt.deadline:.6g} s)" if vt.deadline < math.inf else "")

                   for vt in self._threads if not vt.done]
        return "simulation deadlocked: " + "; ".join(waiting)

    def _fail(self, error: BaseException) -> None:
        if self._failed is None:
            self._failed = error
        for vt in self._threads:
            vt.resume.set()
        self._all_done.set()

    def stop(self, error: BaseException) -> None:
        """End the run: every waiting thread raises ``error`` (the first stop's)."""
        self._fail(error)

    @property
    def failed(self) -> BaseException | None:
        return self._failed

    # -- Concurrency -----------------------------------------------------------------------
    def thread(self, target: Callable[..., None], name: str, args: tuple = ()) -> Any:
        return _Thread(self, target, name, args)

    def lock(self) -> Any:
        return _Lock(self)

    def condition(self, lock: Any = None) -> Any:
        return _Condition(self, lock if lock is not None else _Lock(self))

    def event(self) -> Any:
        return _Event(self)

    def monotonic(self) -> float:
        return self._now()

    def wait_for(self, ready: Ready, timeout: float | None, what: str) -> bool:
        """(A running thread.) Block until ``ready()`` gives a time, at most ``timeout``
        virtual seconds (None: no limit): True if it did."""
        deadline = math.inf if timeout is None else self._now() + max(0.0, timeout)
        now = ready()
        if now is not None and now <= self._now():
            return True
        return self.block(ready, deadline, what)

    def holds(self, predicate: Callable[[], bool]) -> Ready:
        """A readiness that is now (the running thread's clock, as the picker evaluates it)
        once ``predicate()`` holds."""
        def ready() -> float | None:
            if not predicate():
                return None
            current = self._current
            return self._clocks[current.rank] if current is not None else 0.0
        return ready


class _Thread:
    def __init__(self, scheduler: Scheduler, target: Callable[..., None], name: str,
                 args: tuple) -> None:
        self._s, self._target, self._args, self.name = scheduler, target, args, name
        self._vt: _VThread | None = None

    def start(self) -> None:
        rank = self._s.running().rank
        self._vt = self._s.spawn(lambda: self._target(*self._args), rank, self.name)

    def join(self, timeout: float | None = None) -> None:
        vt = self._vt
        if vt is None or vt.done:
            return
        me = self._s.running()
        vt.joiners.append(me)
        try:
            self._s.wait_for(self._s.holds(lambda: vt.done), timeout, f"{self.name} to end")
        finally:
            vt.joiners.remove(me)

    def is_alive(self) -> bool:
        return self._vt is not None and not self._vt.done


class _Lock:
    def __init__(self, scheduler: Scheduler) -> None:
        self._s = scheduler
        self._owner: _VThread | None = None
        self._waiting: list[_VThread] = []

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        me = self._s.running()
        if self._owner is not None:
            if not blocking:
                return False
            self._waiting.append(me)
            try:
                got = self._s.wait_for(self._s.holds(lambda: self._owner is None),
                                       None if timeout < 0 else timeout, "a lock")
            finally:
                self._waiting.remove(me)
            if not got:
                return False
        self._owner = me
        return True

    def release(self) -> None:
        self._owner = None
        for waiter in self._waiting:
            self._s.recheck(waiter)

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


class _Condition:
    def __init__(self, scheduler: Scheduler, lock: _Lock) -> None:
        self._s, self._lock = scheduler, lock
        self._waiters: list[list[Any]] = []   # [notified at, thread]

    def acquire(self, *args: Any) -> bool:
        return self._lock.acquire(*args)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()

    def wait(self, timeout: float | None = None) -> bool:
        token: list[Any] = [None, self._s.running()]
        self._waiters.append(token)
        self._lock.release()
        try:
            woke = self._s.wait_for(lambda: token[0], timeout, "a condition")
        finally:
            if token in self._waiters:
                self._waiters.remove(token)
            # Taken back whatever happens, a death too (ThreadKilled unwinds through the
            # caller's ``with``, which releases it: it must hold it); the death comes at the
            # thread's next turn.
            me = self._s.running()
            me.shielded = True
            try:
                self._lock.acquire()
            finally:
                me.shielded = False
        return woke

    def wait_for(self, predicate: Callable[[], Any], timeout: float | None = None) -> Any:
        end = None if timeout is None else self._s.monotonic() + timeout
        result = predicate()
        while not result:
            left = None if end is None else end - self._s.monotonic()
            if left is not None and left <= 0:
                break
            self.wait(left)
            result = predicate()
        return result

    def notify(self, n: int = 1) -> None:
        now = self._s.monotonic()
        woken, self._waiters[:n] = self._waiters[:n], []
        for token in woken:
            token[0] = now
            self._s.recheck(token[1])

    def notify_all(self) -> None:
        self.notify(len(self._waiters))


class _Event:
    def __init__(self, scheduler: Scheduler) -> None:
        self._s = scheduler
        self._flag = False
        self._waiters: list[list[Any]] = []   # [set at, thread]

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        self._flag = True
        if self._waiters:
            now = self._s.monotonic()
            woken, self._waiters = self._waiters, []
            for token in woken:
                token[0] = now
                self._s.recheck(token[1])

    def clear(self) -> None:
        self._flag = False

    def wait(self, timeout: float | None = None) -> bool:
        if self._flag:
            return True
        token: list[Any] = [None, self._s.running()]
        self._waiters.append(token)
        woke = self._s.wait_for(lambda: token[0], timeout, "an event")
        if not woke and token in self._waiters:
            self._waiters.remove(token)
        return woke or self._flag
