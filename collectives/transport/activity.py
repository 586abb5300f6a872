"""What this peer's operations are doing, per channel: the record the I/O thread answers peers
from, so a peer busy in Python (or idle, between calls) still tells the others where it is.

Two questions come over the wire:

- PLAN (a neighbour exchange's "I send to you / I receive from you", see
  algorithms/neighbor.py): a peer that names this one in its pattern when this peer's call at
  the same sequence does not name it would wait forever for an answer that only this peer can
  give. ``plan_arrived`` says whether to deliver the plan to the operation's mailbox or to
  answer it at once as a stranger ("my call does not involve you"); plans for operations not
  begun yet wait here until ``begin`` sorts them.
- STATUS (after a wait timed out): which operation this peer is inside on a channel, and what
  it is waiting on, so the error can follow the chain of waiting peers to the one that is
  missing (``status``).

Bounded: finished operations are remembered for the last RECENT sequence numbers per channel;
that is all a late plan or a status question needs.
"""
from __future__ import annotations

import threading
from typing import NamedTuple

__all__ = ["Activity", "Status", "IDLE", "INSIDE", "FINISHED", "BUSY", "RECENT", "same_call"]

# The states a STATUS answer reports for the operation asked about (wire values: the reply's
# ``slot``; 0 is the question itself): not started and idle since the operation it names, inside
# it, finished with it, not started and still inside the (earlier) operation it names.
IDLE, INSIDE, FINISHED, BUSY = 1, 2, 3, 4
RECENT = 1024  # finished operations remembered per peer (plans and status questions are late
# by a few operations at most)


def same_call(theirs: str, ours: str) -> bool:
    """Whether two signatures are one call; a phase of a call carries a suffix
    ("allgather(variable)[counts]") and is the same call."""
    return theirs == ours or theirs.split("[", 1)[0] == ours.split("[", 1)[0]


def _mismatch(ours: str, seq: int, src: int, theirs: str) -> str:
    return (f"called {ours} at sequence {seq}, but rank {src} sent a chunk for {theirs} at "
            "that sequence: the peers made different calls")


class Status(NamedTuple):
    """A peer's answer about operation ``seq`` of one channel: ``state`` (IDLE, INSIDE,
    FINISHED, BUSY); the operation it is inside or last began (``current_seq``, ``signature``; -1
    and "" for none); the rank it is waiting on (-1: none)."""
    state: int
    current_seq: int
    signature: str
    waiting_on: int


class _Op:
    __slots__ = ("signature", "neighbours", "waiting_on", "strangers", "finished", "mismatch")

    def __init__(self, signature: str, neighbours: frozenset | None) -> None:
        self.signature = signature
        self.mismatch: str | None = None  # a message of another call arrived for this one
        self.neighbours = neighbours  # None: every peer takes part
        self.waiting_on = -1
        self.strangers: list[int] = []  # peers that named this one though it does not name them
        self.finished = False


class Activity:
    """The operations of one peer by (channel, seq), written by the calling threads and read by
    the thread that handles arrivals (one lock: every access is a few dict operations)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ops: dict[tuple[int, int], _Op] = {}  # in the order begun (oldest dropped)
        self._current: dict[int, int] = {}  # channel -> the latest sequence begun
        self._pending: dict[tuple[int, int], set[int]] = {}  # plans before their operation
        # The first chunk's (src, call) of each collective operation not begun yet: a chunk of
        # another call that came early is a mismatch found when the operation begins.
        self._early: dict[tuple[int, int], tuple[int, str]] = {}

    def begin(self, channel: int, seq: int, signature: str,
              neighbours: frozenset | None = None) -> list[int]:
        """Operation ``(channel, seq)`` starts; ``neighbours``: the peers a neighbour exchange
        involves (None: all). Returns the peers whose plans arrived first although this call
        does not involve them (the caller answers them and refuses the call)."""
        key, op = (channel, seq), _Op(signature, neighbours)
        with self._lock:
            ops = self._ops
            ops[key] = op
            if seq > self._current.get(channel, -1):
                self._current[channel] = seq
            while len(ops) > RECENT:
                del ops[next(iter(ops))]
            # Both are empty but for calls that came early (a dict's truth is cheaper than a pop).
            if self._early:
                first = self._early.pop(key, None)
                if first is not None and not same_call(first[1], signature):
                    op.mismatch = _mismatch(signature, seq, *first)
            early = self._pending.pop(key, ()) if self._pending else ()
            if neighbours is None:
                return []
            op.strangers = sorted(src for src in early if src not in neighbours)
            return list(op.strangers)

    def end(self, channel: int, seq: int, failed: bool = False) -> None:
        """Operation ``(channel, seq)`` ended. A failed one keeps the rank it was waiting on:
        a peer asking later follows it there (this peer gave up waiting on that rank). No lock:
        one dict read and two attribute writes; a status() read between them is as good."""
        op = self._ops.get((channel, seq))
        if op is not None:
            if not failed:
                op.waiting_on = -1
            op.finished = True

    def strangers(self, channel: int, seq: int) -> list[int]:
        """The peers that named operation ``(channel, seq)`` though it does not name them."""
        with self._lock:
            op = self._ops.get((channel, seq))
            return list(op.strangers) if op is not None else []

    def waiting(self, channel: int, seq: int, src: int) -> str | None:
        """Operation ``(channel, seq)`` now waits on ``src`` (-1: on nobody in particular).
        Returns the mismatch found for it meanwhile (see arrived), if any: set before this
        reads it, or read by arrived after this set waiting_on, so it is never missed."""
        op = self._ops.get((channel, seq))  # one dict read, no lock: a torn read is harmless
        if op is None:
            return None
        op.waiting_on = src
        return op.mismatch

    def mismatch_of(self, channel: int, seq: int) -> str | None:
        """The mismatch recorded for operation ``(channel, seq)`` (see arrived), if any."""
        op = self._ops.get((channel, seq))
        return None if op is None else op.mismatch

    def arrived(self, src: int, channel: int, seq: int, their_call: str) -> int | None:
        """A message of ``their_call`` from ``src`` arrived for ``(channel, seq)``: if this
        peer's operation there is another call, record the mismatch and return the rank the
        operation waits on (-1: none yet), whose mailbox should wake it; else None. Runs for
        every arriving chunk, so no lock: one dict read and a string comparison."""
        key = (channel, seq)
        op = self._ops.get(key)
        if op is None:
            # Collective channels are even (wire.Channel); point-to-point ones have no begin.
            if channel % 2 or key in self._early:
                return None
            with self._lock:  # begin() may be registering it right now
                op = self._ops.get(key)
                if op is None:
                    self._early[key] = (src, their_call)
                    if len(self._early) > RECENT:  # operations that never begin here
                        self._early.pop(next(iter(self._early)))
                    return None
        if their_call == op.signature or op.finished or op.mismatch is not None \
                or same_call(their_call, op.signature):
            return None
        op.mismatch = _mismatch(op.signature, seq, src, their_call)
        return op.waiting_on

    def plan_arrived(self, src: int, channel: int, seq: int) -> bool:
        """A PLAN from ``src`` for ``(channel, seq)``: True to deliver it to the mailbox, False
        when this peer's call there does not involve ``src`` (answer it as a stranger)."""
        # The usual case, a plan for an operation under way that involves src, without the
        # lock: one dict read (atomic), as in arrived(); an op is never mutated to exclude src.
        op = self._ops.get((channel, seq))
        if op is not None and (op.neighbours is None or src in op.neighbours):
            return True
        with self._lock:
            op = self._ops.get((channel, seq))
            if op is None:
                self._pending.setdefault((channel, seq), set()).add(src)
                if len(self._pending) > RECENT:  # plans for calls that never come
                    self._pending.pop(next(iter(self._pending)))
                return True
            if op.neighbours is None or src in op.neighbours:
                return True
            if not op.finished:
                op.strangers.append(src)
            return False

    def status(self, channel: int, seq: int) -> Status:
        """What this peer says when asked about operation ``(channel, seq)``."""
        with self._lock:
            current = self._current.get(channel, -1)
            op = self._ops.get((channel, seq))
            if op is not None:
                state = FINISHED if op.finished else INSIDE
                return Status(state, seq, op.signature, op.waiting_on)
            if seq > current:
                last = self._ops.get((channel, current))
                if last is None:
                    return Status(IDLE, current, "", -1)
                return Status(IDLE if last.finished else BUSY, current, last.signature,
                              last.waiting_on)
            return Status(FINISHED, seq, "", -1)  # long finished (forgotten)
