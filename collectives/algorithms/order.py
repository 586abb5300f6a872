"""Sequence order for operations that share state across calls (the shared-memory
allreduces): each waits its turn, the lowest sequence number reserved and not yet done."""
from __future__ import annotations

import threading
import time
from typing import Any

from collectives.errors import OperationTimeout, PeerLost

__all__ = ["SequenceOrder"]


class SequenceOrder:
    """Reserved sequence numbers, run one at a time, lowest first."""

    def __init__(self) -> None:
        # (The lock taken directly where nothing waits: a Condition's own ``with`` is a
        # Python call, and every small call on one host takes a turn.)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._reserved: set[int] = set()
        self._waiting = 0   # threads in _begin's wait (notified as a turn ends)

    def reserve(self, seq: int) -> None:
        """(When ``seq`` is taken, under the lock that takes it.)"""
        with self._lock:
            self._reserved.add(seq)

    def release(self, seq: int) -> None:
        """Give up reserved ``seq`` without running it (the call went another way)."""
        with self._cond:
            self._reserved.discard(seq)
            self._cond.notify_all()

    def wait_before(self, seq: int, deadline: float, transport: Any, what: str) -> None:
        """Return once every call reserved before ``seq`` is done (OperationTimeout at
        ``deadline``; PeerLost once the transport closes), without taking a turn; ``what``:
        the waiting call, as errors name it."""
        with self._cond:
            while any(s < seq for s in self._reserved):
                left = deadline - time.monotonic()
                self._check(seq, left, transport, what)
                self._waiting += 1
                try:
                    self._cond.wait(min(left, 0.1))
                finally:
                    self._waiting -= 1

    def _check(self, seq: int, left: float, t: Any, what: str) -> None:
        if t.closed:
            raise PeerLost(f"rank {t.rank}: {what}: this peer was closed", operation=what)
        if left <= 0:
            raise OperationTimeout(
                f"rank {t.rank}: {what}: shared-memory calls "
                f"{sorted(s for s in self._reserved if s < seq)} of this peer, taken "
                "before it, did not run within the timeout", operation=what)

    def turn(self, call: Any) -> "_Turn":
        """``with order.turn(call):`` waits until ``call.seq`` is the lowest reserved
        (OperationTimeout at the call's deadline, PeerLost once the transport closes), runs
        the body, then hands over to the next, whatever the body raised."""
        return _Turn(self, call)

    def _begin(self, call: Any) -> None:
        seq = call.seq
        with self._lock:
            reserved = self._reserved
            reserved.add(seq)   # (a call made without reserve: runs in its turn too)
            if len(reserved) == 1:   # (the usual case: no one else reserved)
                return
            while min(reserved) != seq:
                left = call.deadline - time.monotonic()
                try:
                    self._check(seq, left, call.transport, call.describe())
                except (PeerLost, OperationTimeout):
                    reserved.discard(seq)
                    self._cond.notify_all()
                    raise
                self._waiting += 1
                try:
                    self._cond.wait(min(left, 0.1))
                finally:
                    self._waiting -= 1

    def _end(self, seq: int) -> None:
        with self._lock:
            self._reserved.discard(seq)
            if self._waiting:   # (a notify costs a small call's microsecond: only if heard)
                self._cond.notify_all()


class _Turn:
    """A call's turn (SequenceOrder.turn), as a context manager: a class, not a generator,
    since every small call on one host takes one."""

    __slots__ = ("order", "call")

    def __init__(self, order: SequenceOrder, call: Any) -> None:
        self.order, self.call = order, call

    def __enter__(self) -> None:
        self.order._begin(self.call)

    def __exit__(self, *exc: Any) -> None:
        self.order._end(self.call.seq)
