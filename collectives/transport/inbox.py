"""The inbox: where the I/O thread leaves validated messages and where operations wait for them.

Messages are matched by slot ``(src, channel, seq)``; within a slot they keep the order in which
the source sent them (one ZeroMQ pipe per source preserves order), so a chunked array arrives
chunk by chunk. A slot is retired when its operation ends; anything that later arrives for a
retired slot is a duplicate or a replay and is dropped.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

__all__ = ["Inbox", "Lost", "SlotError"]

Key = tuple[int, int, int]  # (src, channel, seq)


@dataclass
class Lost:
    """Why a source cannot deliver any more: it died, closed, or failed authentication."""
    reason: str
    kind: str = "lost"  # "lost" | "closed" | "auth"


@dataclass
class SlotError:
    """An error posted to one slot: a malformed message or an ABORT from the source.
    ``lost_rank`` is set when the source abandoned the operation because that rank was lost,
    so the error can travel on as PeerLost naming the dead peer."""
    message: str
    lost_rank: int | None = None


class _Slot:
    """The messages of one (src, channel, seq), and the condition a consumer waits on. The
    condition is made only when a consumer has to wait: most small messages are read as soon
    as they arrive, and making one per message was a visible part of a 4 KiB allreduce."""

    __slots__ = ("cond", "items", "error", "touched")

    def __init__(self) -> None:
        self.cond: threading.Condition | None = None
        self.items: deque = deque()
        self.error: SlotError | None = None
        self.touched = False  # a consumer has asked for this slot: its operation is running

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
        if seq < self.low:
            return
        self.above.add(seq)
        while self.low in self.above:
            self.above.discard(self.low)
            self.low += 1

    def __contains__(self, seq: int) -> bool:
        return seq < self.low or seq in self.above


class Inbox:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slots: dict[Key, _Slot] = {}
        self._retired: dict[tuple[int, int], _Retired] = {}
        self._lost: dict[int, Lost] = {}
        self._running: set[tuple[int, int]] = set()  # (channel, seq) of operations under way
        self._closed = False
        # Woken by every delivery, error, loss and close: what wait_any() sleeps on.
        self._arrivals = threading.Condition(self._lock)

    # -- producer side (the I/O thread) ------------------------------------------------------
    def put(self, key: Key, item: Any) -> bool:
        """Deliver one message; False (and nothing kept) if its slot was already retired."""
        with self._lock:
            retired = self._retired.get(key[:2])
            if retired is not None and key[2] in retired:
                return False
            slot = self._slot(key)
            slot.items.append(item)
            slot.notify()
            self._arrivals.notify_all()
            return True

    def post_error(self, key: Key, error: SlotError) -> None:
        with self._lock:
            retired = self._retired.get(key[:2])
            if retired is not None and key[2] in retired:
                return
            slot = self._slot(key)
            if slot.error is None:
                slot.error = error
            slot.notify(every=True)
            self._arrivals.notify_all()

    def mark_lost(self, src: int, lost: Lost) -> None:
        with self._lock:
            if src in self._lost:
                return
            self._lost[src] = lost
            for (s, _, _), slot in self._slots.items():
                if s == src:
                    slot.notify(every=True)
            self._arrivals.notify_all()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for slot in self._slots.values():
                slot.notify(every=True)
            self._arrivals.notify_all()

    # -- consumer side (operations) ----------------------------------------------------------
    def get(self, key: Key, deadline: float) -> Any:
        """Next message of a slot. Returns the item, or raises nothing itself: returns one of
        ``Lost``/``SlotError``/``None`` (deadline passed) so the caller can word the error with
        what it knows (operation, address)."""
        with self._lock:
            slot = self._slot(key)
            slot.touched = True
            while True:
                ready = self._ready(key, slot)
                if ready is not None:
                    return ready
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                if slot.cond is None:
                    slot.cond = threading.Condition(self._lock)
                slot.cond.wait(remaining)

    def take(self, key: Key) -> Any:
        """What get() would return at once, or None where it would wait."""
        with self._lock:
            slot = self._slot(key)
            slot.touched = True
            return self._ready(key, slot)

    def _ready(self, key: Key, slot: _Slot) -> Any:
        if slot.items:
            return slot.items.popleft()
        if slot.error is not None:
            return slot.error
        lost = self._lost.get(key[0])
        if lost is not None:
            return lost
        if self._closed:
            return Lost("this peer was closed", kind="closed")
        return None

    def begin(self, channel: int, seq: int) -> None:
        """An operation started: its messages are wanted soon, never spilled."""
        with self._lock:
            self._running.add((channel, seq))

    def end(self, channel: int, seq: int) -> None:
        with self._lock:
            self._running.discard((channel, seq))

    def spill(self, src: int, move: Any) -> int:
        """Replace, with ``move(item)``, every message from ``src`` waiting in a slot that no
        operation has asked for yet (shared-memory chunks are copied out, so the sender can
        reuse their slots for operations that are running). Returns how many moved."""
        moved = 0
        with self._lock:
            for (s, channel, seq), slot in self._slots.items():
                if s == src and not slot.touched and (channel, seq) not in self._running:
                    for i, item in enumerate(slot.items):
                        new = move(item)
                        if new is not item:
                            slot.items[i] = new
                            moved += 1
        return moved

    def unget(self, key: Key, item: Any) -> None:
        """Put a message back at the front of its slot (a receiver that peeked at it)."""
        with self._lock:
            self._slot(key).items.appendleft(item)

    def poll(self, key: Key) -> bool:
        """True when get() would return at once."""
        with self._lock:
            slot = self._slots.get(key)
            return bool(slot and (slot.items or slot.error)) or key[0] in self._lost

    def wait_any(self, keys, deadline: float) -> Key | None:
        """The first of ``keys`` whose slot holds a message or an error, waiting (without
        polling) until one does; None at ``deadline`` or once the inbox is closed. A lost
        source with nothing queued is not ready: get() would raise, not deliver."""
        with self._lock:
            while True:
                for key in keys:
                    slot = self._slots.get(key)
                    if slot is not None and (slot.items or slot.error is not None):
                        return key
                if self._closed:
                    return None
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._arrivals.wait(remaining)

    def retire(self, key: Key) -> list:
        """End a slot: drop what is left in it and refuse anything that arrives for it later.
        Returns the undelivered messages (their shared-memory slots must be released)."""
        with self._lock:
            slot = self._slots.pop(key, None)
            self._retired.setdefault(key[:2], _Retired()).add(key[2])
            return list(slot.items) if slot else []

    def lost(self, src: int) -> Lost | None:
        with self._lock:
            return self._lost.get(src)

    def lost_ranks(self) -> dict[int, Lost]:
        with self._lock:
            return dict(self._lost)

    def pending(self) -> int:
        with self._lock:
            return sum(len(s.items) for s in self._slots.values())

    def _slot(self, key: Key) -> _Slot:
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = _Slot()
        return slot
