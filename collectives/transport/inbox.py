"""The inbox: where the I/O thread leaves validated messages and where operations wait for them.

Messages are matched by mailbox, addressed ``(src, channel, seq)``; within a mailbox they keep
the order in which the source sent them (one ZeroMQ pipe per source preserves order), so a
chunked array arrives chunk by chunk. A mailbox is retired when its operation ends; anything
that later arrives for a retired mailbox is a duplicate or a replay and is dropped. ("Mailbox",
not "slot": in collectives a slot is always a shared-memory ring's slot.)

A wait on a mailbox can also end without a message: its source is ``Lost`` (dead, closed,
refused), or an error was posted to the mailbox (a ``MailboxError``: an ABORT, a malformed
message, a chunk of another call). collectives/transport/wait_errors.py words them as
exceptions.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Literal

from collectives import defaults
from collectives.transport.flow_control import KEYED_BOUNDS, HeldBounds

__all__ = ["Inbox", "Lost", "MailboxError", "Address", "RETIRED", "OVER_LINK", "OVER_TOTAL"]

Address = tuple[int, int, int]  # a mailbox: (src, channel, seq)

# What put() says when it keeps nothing: the mailbox was retired (a late or replayed message),
# or the message would take what is held for operations not started past its source's bound,
# or past the total of all sources (flow_control.HeldBounds).
RETIRED, OVER_LINK, OVER_TOTAL = "retired", "over-bound", "over-total"


@dataclass
class Lost:
    """Why a source cannot deliver any more: it died, closed, or failed authentication.
    ``cause``: the rank whose loss made the source give up, when it closed right after an
    operation of its own failed for that loss (its goodbye says so): that rank is the one to
    blame, not the source, which was only the first to leave."""
    reason: str
    kind: str = "lost"  # "lost" | "closed" | "auth"
    cause: int | None = None


@dataclass
class MailboxError:
    """An error posted to one mailbox: a malformed message or an ABORT from the source.
    ``lost_rank`` is set when the source abandoned the operation because that rank was lost,
    so the error can travel on as PeerLost naming the dead peer."""
    message: str
    lost_rank: int | None = None
    late_rank: int | None = None  # the source timed out and found this rank missing
    local: bool = False  # this peer's own finding (a chunk of another call), not the source's
    view_change: bool = False  # the source was ended by a change of the group's view


class _Mailbox:
    """The messages of one (src, channel, seq), and the condition a consumer waits on. The
    condition is made only when a consumer has to wait: most small messages are read as soon
    as they arrive, and making one per message was a visible part of a 4 KiB allreduce."""

    __slots__ = ("cond", "items", "error", "touched", "held")

    def __init__(self) -> None:
        self.cond: threading.Condition | None = None
        self.items: deque = deque()
        self.error: MailboxError | None = None
        self.touched = False  # a consumer has asked for this mailbox: its operation is running
        self.held = 0  # bytes counted against the held bound until a consumer asks (see put)

    def notify(self, every: bool = False) -> None:
        if self.cond is not None:
            if every:
                self.cond.notify_all()
            else:
                self.cond.notify()


class _Retired:
    """Retired sequence numbers of one (src, channel): a watermark plus the retired ones above
    it, so memory stays bounded while operations retire out of order."""

    __slots__ = ("low", "above")

    def __init__(self) -> None:
        self.low = 0
        self.above: set[int] = set()

    def add(self, seq: int) -> None:
        if seq == self.low and not self.above:  # in order: the usual case
            self.low = seq + 1
            return
        if seq < self.low:
            return
        self.above.add(seq)
        while self.low in self.above:
            self.above.discard(self.low)
            self.low += 1

    def __contains__(self, seq: int) -> bool:
        return seq < self.low or seq in self.above


class Inbox:
    """Every mailbox of one peer, the sources known lost, and the conditions consumers wait on
    (one lock for all: deliveries are short, and wait_any needs a view across mailboxes)."""

    def __init__(self, bounds: HeldBounds = KEYED_BOUNDS) -> None:
        self._lock = threading.Lock()
        self._boxes: dict[Address, _Mailbox] = {}
        # Bytes held for operations nobody has asked for yet, per source and in total, and
        # their bounds (see put): what a sender can make this peer hold before it starts.
        self._held: dict[int, int] = {}
        self._held_total = 0
        self.bounds = bounds
        self._held_per_link = bounds.per_link
        self._held_bound = bounds.total
        self._pause, self._resume_below = bounds.pause, bounds.resume
        # Past this total every source that delivers is paused too (None: never, with a key).
        self._total_pause = bounds.total_pause if bounds.total_pause is not None else bounds.total
        self._total_resume = bounds.total_resume if bounds.total_resume is not None \
            else bounds.total
        self._pause_total = bounds.total_pause is not None
        # Flow control (flow_control.Holds): sources asked to pause, the callback that asks
        # (src, pause, generation), called after the lock is released, and the generation.
        self._holding: set[int] = set()
        self.on_hold: Callable[[int, bool, int], None] | None = None
        self._hold_generation = 0
        self.held_peak = 0  # the most ever held for one source (for tests and stats)
        self.held_total_peak = 0  # the most ever held, all sources together
        # Sources an operation is waiting on right now (src -> waiters): the total alone never
        # pauses them (their messages for the operation may be queued behind the pause), only
        # their own holding does, as before; the hard bounds apply to them as to anyone.
        self._wanted: dict[int, int] = {}
        self._retired: dict[tuple[int, int], _Retired] = {}
        self._lost: dict[int, Lost] = {}
        self._running: set[tuple[int, int]] = set()  # (channel, seq) of operations under way
        self._closed = False
        # Woken by every delivery, error, loss and close: what wait_any() sleeps on.
        self._arrivals = threading.Condition(self._lock)
        self._any_waiters = 0  # callers inside wait_any: only they need _arrivals notified

    # -- producer side (the I/O thread) ------------------------------------------------------
    def put(self, key: Address, item: Any, nbytes: int = 0) -> Literal[True] | str:
        """Deliver one message: True if kept. Else nothing is kept and it says why: RETIRED
        (its mailbox was already retired), OVER_LINK or OVER_TOTAL (it is for an operation not
        started yet and its ``nbytes`` would take what is held for such operations past the
        bound of its source, or past the total)."""
        pause: tuple | None = None
        with self._lock:
            retired = self._retired.get(key[:2])
            if retired is not None and key[2] in retired:
                return RETIRED
            box = self._boxes.get(key)
            if nbytes and (box is None or not box.touched) \
                    and (key[1], key[2]) not in self._running:
                # Counted until a consumer asks for the mailbox (get/take) or it retires: a
                # couple of integer additions per message, under the lock put holds anyway.
                counted = self._count(key[0], nbytes)
                if isinstance(counted, str):
                    return counted
                pause = counted
                if box is None:
                    box = self._boxes[key] = _Mailbox()
                box.held += nbytes
            elif box is None:
                box = self._boxes[key] = _Mailbox()
            box.items.append(item)
            box.notify()
            if self._any_waiters:  # (a Condition's notify is Python code: skipped when idle)
                self._arrivals.notify_all()
        if pause is not None:
            self._ask(pause)
        return True

    def _count(self, src: int, nbytes: int) -> tuple | str | None:
        """(Under the lock.) Count ``nbytes`` more held from ``src`` for an operation not
        started: OVER_LINK / OVER_TOTAL (nothing counted) past a bound, else the pause to ask
        for (None if none)."""
        held = self._held.get(src, 0) + nbytes
        total = self._held_total + nbytes
        if held > self._held_per_link:
            return OVER_LINK
        if total > self._held_bound:
            return OVER_TOTAL
        self._held[src] = held
        self._held_total = total
        if held > self.held_peak:
            self.held_peak = held
        if total > self.held_total_peak:
            self.held_total_peak = total
        if (held > self._pause or total > self._total_pause and src not in self._wanted) \
                and src not in self._holding and self.on_hold is not None:
            self._holding.add(src)
            self._hold_generation += 1
            return (src, True, self._hold_generation)
        return None

    def post_error(self, key: Address, error: MailboxError) -> Literal[True] | str:
        """Post ``error`` to mailbox ``key`` and wake all its waiters; the first error stays, and a
        retired mailbox ignores it (RETIRED). A new mailbox of an operation not started is
        counted as held (HELD_OVERHEAD), so errors cannot grow the process either: past a
        bound nothing is kept (OVER_LINK / OVER_TOTAL)."""
        pause: tuple | None = None
        with self._lock:
            retired = self._retired.get(key[:2])
            if retired is not None and key[2] in retired:
                return RETIRED
            box = self._boxes.get(key)
            if box is None and (key[1], key[2]) not in self._running:
                counted = self._count(key[0], defaults.HELD_OVERHEAD)
                if isinstance(counted, str):
                    return counted
                pause = counted
                box = self._boxes[key] = _Mailbox()
                box.held = defaults.HELD_OVERHEAD
            elif box is None:
                box = self._boxes[key] = _Mailbox()
            if box.error is None:
                box.error = error
            box.notify(every=True)
            self._arrivals.notify_all()
        if pause is not None:
            self._ask(pause)
        return True

    def mark_lost(self, src: int, lost: Lost) -> None:
        """Record that ``src`` can deliver no more (the first reason stays) and wake everyone
        waiting on it."""
        with self._lock:
            if src in self._lost:
                return
            self._lost[src] = lost
            for (s, _, _), box in self._boxes.items():
                if s == src:
                    box.notify(every=True)
            self._arrivals.notify_all()

    def close(self) -> None:
        """Close: every waiter wakes, mailboxes with nothing queued answer Lost (closed) and
        wait_any returns None."""
        with self._lock:
            self._closed = True
            for box in self._boxes.values():
                box.notify(every=True)
            self._arrivals.notify_all()

    def _ask(self, request: tuple) -> None:
        """Pass a pause or resume request (src, pause, generation) to ``on_hold``, which is
        set whenever a source can be held (a pause is made only then)."""
        if self.on_hold is not None:
            self.on_hold(*request)

    # -- consumer side (operations) ----------------------------------------------------------
    def _claim(self, key: Address) -> tuple[Any, list]:
        """(Under the lock.) The mailbox ``key``, claimed by its operation: what it holds no
        longer counts as held for operations not started. Returns it and the resume requests
        that releasing made due."""
        box = self._box(key)
        box.touched = True
        return box, (self._release(key[0], box) if box.held else [])

    def get(self, key: Address, deadline: float) -> Any:
        """Next message of a mailbox. Returns the item, or raises nothing itself: returns one of
        ``Lost``/``MailboxError``/``None`` (deadline passed) so the caller can word the error with
        what it knows (operation, address)."""
        with self._lock:
            box, resumes = self._claim(key)
            while not resumes:
                ready = self._ready(key, box)
                if ready is not None:
                    return ready
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                if key[0] in self._holding:
                    # An operation under way waits on a source we asked to pause: its
                    # messages may be queued behind the held ones (another channel), so let
                    # the source go on; the hard bound still applies.
                    resumes = [self._resume(key[0])]
                    break
                if box.cond is None:
                    box.cond = threading.Condition(self._lock)
                box.cond.wait(remaining)
        for resume in resumes:
            self._ask(resume)
        return self.get(key, deadline)

    def want(self, src: int) -> None:
        """An operation starts waiting on ``src`` (until ``unwant``): if it is paused, let it go
        on (its messages for the operation may be queued behind the pause), and the total
        alone does not pause it again meanwhile."""
        if not self._pause_total:  # (with a key the total pauses nobody: nothing to do)
            return
        with self._lock:
            self._wanted[src] = self._wanted.get(src, 0) + 1
            resume = self._resume(src) if src in self._holding else None
        if resume is not None:
            self._ask(resume)

    def unwant(self, src: int) -> None:
        """The twin of want()."""
        if not self._pause_total:
            return
        with self._lock:
            left = self._wanted.get(src, 0) - 1
            if left > 0:
                self._wanted[src] = left
            else:
                self._wanted.pop(src, None)

    def take(self, key: Address) -> Any:
        """What get() would return at once, or None where it would wait."""
        with self._lock:
            box, resumes = self._claim(key)
            ready = self._ready(key, box)
        for resume in resumes:
            self._ask(resume)
        return ready

    def _ready(self, key: Address, box: _Mailbox) -> Any:
        if box.items:
            return box.items.popleft()
        if box.error is not None:
            return box.error
        lost = self._lost.get(key[0])
        if lost is not None:
            return lost
        if self._closed:
            return Lost("this peer was closed", kind="closed")
        return None

    def begin(self, channel: int, seq: int) -> None:
        """An operation started: its messages are wanted soon, never replaced (copied out of
        their shared-memory slots, see replace_unclaimed) until it ends (retire_all's
        ``ended``)."""
        with self._lock:
            self._running.add((channel, seq))

    def replace_unclaimed(self, src: int, move: Any) -> int:
        """Replace, with ``move(item)``, every message from ``src`` waiting in a mailbox that no
        operation has asked for yet (see shm.SharedMemory.starved: it copies shared-memory
        chunks out). What a replacement takes in private memory (its payload's bytes) counts
        as held: one that would pass a bound is left as it is, and so are those after it.
        Returns how many were replaced."""
        moved = 0
        pause: tuple | None = None
        with self._lock:
            for (s, channel, seq), box in self._boxes.items():
                if s == src and not box.touched and (channel, seq) not in self._running:
                    for i, item in enumerate(box.items):
                        if type(item) is not tuple or item[2] is None:
                            continue  # in private memory already
                        nbytes = memoryview(item[1]).nbytes
                        counted = self._count(src, nbytes)
                        if isinstance(counted, str):
                            break  # over a bound: the rest waits in the sender's ring
                        pause = pause or counted
                        new = move(item)
                        if new is not item:
                            box.items[i] = new
                            box.held += nbytes
                            moved += 1
                    else:
                        continue
                    break
        if pause is not None:
            self._ask(pause)
        return moved

    def unget(self, key: Address, item: Any) -> None:
        """Put a message back at the front of its mailbox (a receiver that peeked at it)."""
        with self._lock:
            self._box(key).items.appendleft(item)

    def poll(self, key: Address) -> bool:
        """True when get() would return at once."""
        with self._lock:
            box = self._boxes.get(key)
            return bool(box and (box.items or box.error)) or key[0] in self._lost \
                or self._closed

    def wait_any(self, keys, deadline: float) -> Address | None:
        """The first of ``keys`` whose mailbox holds a message or an error, waiting (without
        polling) until one does; None at ``deadline`` or once the inbox is closed. A lost
        source with nothing queued is not ready: get() would raise, not deliver. Its sources
        are wanted meanwhile (see want)."""
        srcs = {k[0] for k in keys}
        for src in srcs:
            self.want(src)
        try:
            return self._wait_any(keys, deadline)
        finally:
            for src in srcs:
                self.unwant(src)

    def _wait_any(self, keys, deadline: float) -> Address | None:
        resumes = []
        with self._lock:
            while True:
                for key in keys:
                    box = self._boxes.get(key)
                    if box is not None and (box.items or box.error is not None):
                        return key
                if self._closed:
                    return None
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                # As in get(): a caller waiting on a paused source lets it go on.
                resumes = [self._resume(s) for s in {k[0] for k in keys} & self._holding]
                if resumes:
                    break
                self._any_waiters += 1
                try:
                    self._arrivals.wait(remaining)
                finally:
                    self._any_waiters -= 1
        for resume in resumes:
            self._ask(resume)
        return self._wait_any(keys, deadline)

    def retire(self, key: Address) -> list:
        """End a mailbox: drop what is left in it and refuse anything that arrives for it later.
        Returns the undelivered messages (their shared-memory slots must be released)."""
        return self.retire_all(key[1], key[2], (key[0],))

    def retire_all(self, channel: int, seq: int, srcs, *, ended: bool = False) -> list:
        """retire() mailbox ``(src, channel, seq)`` of each of ``srcs`` under one lock;
        ``ended``: the operation ``(channel, seq)`` ended too (begin()'s twin)."""
        left: list = []
        resumes: list[tuple] = []
        with self._lock:
            if ended:
                self._running.discard((channel, seq))
            boxes, retired = self._boxes, self._retired
            for src in srcs:
                box = boxes.pop((src, channel, seq), None)
                marks = retired.get((src, channel)) or retired.setdefault((src, channel),
                                                                          _Retired())
                marks.add(seq)
                if box is not None:
                    if box.held:
                        resumes.extend(self._release(src, box))
                    left.extend(box.items)
        for resume in resumes:
            self._ask(resume)
        return left

    def drop_unclaimed(self, src: int) -> int:
        """Empty every mailbox of ``src`` no operation has asked for (a cut connection's
        leftovers); returns the bytes freed. Those mailboxes stay open: the operation, if it
        ever starts, waits for its messages like any other."""
        resumes = []
        with self._lock:
            freed = 0
            # The source is cut: no resume for it, ever.
            self._holding.discard(src)
            for (s, channel, seq), box in list(self._boxes.items()):
                # Only mailboxes holding socket payloads (counted bytes): a shared-memory item
                # owns a ring slot that must be released by its reader, not dropped here.
                if s == src and box.held and not box.touched \
                        and not any(type(item) is tuple and item[2] is not None
                                    for item in box.items) \
                        and (channel, seq) not in self._running:
                    freed += box.held
                    resumes.extend(self._release(src, box))
                    del self._boxes[(s, channel, seq)]
        for resume in resumes:  # others paused for the total may go on now
            self._ask(resume)
        return freed

    def holding(self, src: int) -> bool:
        """True while ``src`` is asked to pause. Read without the lock (a set lookup, for every
        message that would be acknowledged): a stale answer only moves one ACK by a message,
        and the thread that pauses a source (it reads the ROUTER) sees its own pause."""
        return src in self._holding

    @property
    def paused(self) -> set[int]:
        """The sources asked to pause, live (the set itself, to read without a call per
        message: see holding)."""
        return self._holding

    def held(self) -> tuple[dict[int, int], int]:
        """Bytes held for operations not started: per source, and in total."""
        with self._lock:
            return {src: n for src, n in self._held.items() if n}, self._held_total

    def _release(self, src: int, box: _Mailbox) -> list:
        """Stop counting ``box``'s bytes (lock held); the resumes to send: ``src`` if that brings
        it below its resume threshold with the total below its own, and, when this brings the
        total below it, every paused source below its threshold."""
        held = self._held
        before = self._held_total
        held[src] -= box.held
        self._held_total = total = before - box.held
        box.held = 0
        holding = self._holding
        if not holding or total >= self._total_resume:
            return []
        resume_below = self._resume_below
        if before >= self._total_resume:  # the total just went below: every source may go on
            return [self._resume(s) for s in list(holding) if held.get(s, 0) < resume_below]
        if src in holding and held[src] < resume_below:
            return [self._resume(src)]
        return []

    def _resume(self, src: int) -> tuple:
        self._holding.discard(src)
        self._hold_generation += 1
        return (src, False, self._hold_generation)

    def lost(self, src: int) -> Lost | None:
        """Why ``src`` can deliver no more, or None while it can."""
        with self._lock:
            return self._lost.get(src)

    def lost_ranks(self) -> dict[int, Lost]:
        """A copy of every lost source and why (rank -> Lost)."""
        with self._lock:
            return dict(self._lost)

    def _box(self, key: Address) -> _Mailbox:
        box = self._boxes.get(key)
        if box is None:
            box = self._boxes[key] = _Mailbox()
        return box

    @property
    def _slots(self) -> dict:
        # The old name of _boxes, still read by tests/test_shutdown.py (which may not change).
        return self._boxes
